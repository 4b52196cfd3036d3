import { describe, expect, it } from "vitest";
import { createResourcesApp, REPLAYABLE_END_HOLD_MS } from "../../../participants/kinds/resources/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { calculate } from "../../../participants/gym/resources-server/arithmetic-expression.js";
import { CalculatorServer, calculatorServerClass } from "../../../participants/gym/resources-server/calculator-server.js";

describe("arithmetic expression", () => {
  it("evaluates with precedence, parentheses and unary minus", () => {
    expect(calculate("17 + 25")).toBe("42");
    expect(calculate("2 + 3 * 4")).toBe("14");
    expect(calculate("(2 + 3) * 4")).toBe("20");
    expect(calculate("-3 - -4")).toBe("1");
    expect(calculate("7 / 2")).toBe("3.5");
    expect(calculate("1 / 3")).toBe("0.333333333333");
  });

  it("computes exactly: integer results print digit for digit, however large a double would round them", () => {
    expect(calculate("1000000000 * 1000000000000")).toBe("1000000000000000000000");
    expect(calculate("9007199254740993")).toBe("9007199254740993");
    expect(calculate("4611686018427387904 + 1")).toBe("4611686018427387905");
    expect(calculate("1e21 + 1")).toBe("1000000000000000000001");
    expect(calculate("7 / 2 * 2")).toBe("7");
    expect(calculate("0.1 + 0.2")).toBe("0.3");
    expect(calculate("2.5e3")).toBe("2500");
    expect(calculate("1e400 / 1e300")).toBe(`1${"0".repeat(100)}`);
    // Fractions whose parts pass 1023 bits, with a small or a large denominator, and tiny quotients.
    expect(calculate("1e302 / 3")).toBe("3.33333333333e+301");
    expect(calculate("1e200 / (1e30 + 1) * 1e130")).toBe("1e+300");
    expect(calculate("1 / 3e300")).toBe("3.33333333333e-301");
    expect(calculate("-2 / 3")).toBe("-0.666666666667");
    expect(calculate("1e-320 / 3")).toBe(String(Number((1e-320 / 3).toPrecision(12))));
    // The limits stay: a result no double holds, and literals too large to expand, are refused.
    for (const tooLarge of ["1e400", "1e308 * 10", "1e999999", Array.from({ length: 160 }, () => "9e999").join("*")]) {
      expect(() => calculate(tooLarge), tooLarge).toThrow(/result is not finite/);
    }
    // …and one below the smallest double, which would print as 0 (and verify the answer "0").
    for (const tooSmall of ["1e-400", "1 / 1e400", "-1e-330 / 7", "1e-5000", "1 / 1e999999", "1e-999999"]) expect(() => calculate(tooSmall), tooSmall).toThrow(/too small for a double/);
    expect(calculate("1e-400 * 1e400")).toBe("1");
    // A zero literal is zero whatever its exponent, not a result too small for a double.
    for (const zero of ["0e5000", "0.0e-9999", "1 + 0e999999", "0e5000 / 7"]) expect(calculate(zero), zero).toBe(zero.startsWith("1") ? "1" : "0");
  });

  it("computes with literals past a double's range: a result a double holds is printed, zero included", () => {
    // Literals that underflow to 0 or overflow to Infinity as doubles are still exact values.
    for (const zero of ["1e-5000*0", "0 * 1e-5000", "1e5000 * 0", "1e999999 * 0", "1e5000 - 1e5000", "1e-5000 - 1e-5000", "0 / 1e5000"]) {
      expect(calculate(zero), zero).toBe("0");
    }
    expect(calculate("1e-5000 * 1e5000")).toBe("1");
    expect(calculate("3e-5000 / 1e-5000")).toBe("3");
    expect(calculate("2.5e-4000 * 4e4001")).toBe("100");
    expect(calculate("1e5000 / 1e4999 + 1")).toBe("11");
    // A sum of terms thousands of powers of ten apart is computed in doubles, as before.
    expect(calculate("1 + 1e-5000")).toBe("1");
    expect(() => calculate("1e-5000 + 1 - 1")).toThrow(/too small for a double/);
  });

  it("refuses anything that is not arithmetic", () => {
    for (const bad of ["process.exit()", "1 +", "(1", "1 / 0", "2 2", "", "a", "1;2"]) {
      expect(() => calculate(bad), bad).toThrow(/invalid expression/);
    }
    expect(() => calculate("(".repeat(100) + "1" + ")".repeat(100))).toThrow(/nested too deeply/);
  });
});

describe("calculator resources server", () => {
  it("serves seed, tool, verify and close under the rollout prefix", async () => {
    const clock = new ManualClock();
    const { app, kind } = await createResourcesApp(new CalculatorServer(), { clock });
    const seed = await app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", payload: { task: { expression: "17 + 25", tool_rounds: 1 } } });
    expect(seed.statusCode).toBe(200);
    expect(seed.json()).toEqual({});
    expect(seed.headers["x-ng-checkpoint-verify"]).toBe("replay");
    expect(seed.headers["x-ng-checkpoint-restart"]).toBeUndefined();
    const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
    expect(cookie).toMatch(/^ng_session=[A-Za-z0-9_-]{22}$/);
    expect(kind.readiness().counts.sessions).toBe(1);

    const tool = await app.inject({ method: "POST", url: "/ng-rollout/r1/tools/calculator", headers: { cookie }, payload: { expression: "17 + 25" } });
    expect(tool.json()).toEqual({ result: "42" });
    const right = await app.inject({ method: "POST", url: "/ng-rollout/r1/verify", headers: { cookie }, payload: { task: { expression: "17 + 25" }, answer: " 42\n" } });
    expect(right.json()).toEqual({ reward: 1 });
    // Its verify is replayable: the session is held a while for a checkpoint that may be under way.
    expect(kind.readiness().counts.sessions).toBe(1);
    clock.advance(REPLAYABLE_END_HOLD_MS);
    expect(kind.readiness().counts.sessions).toBe(0);
    const wrong = await app.inject({ method: "POST", url: "/ng-rollout/r2/verify", payload: { task: { expression: "17 + 25" }, answer: "41" } });
    expect(wrong.json()).toEqual({ reward: 0 });
    const close = await app.inject({ method: "POST", url: "/ng-rollout/r1/close_session", headers: { cookie } });
    expect(close.statusCode).toBe(200);
    await app.close();
  });

  it("rewards the exact answer of a large integer result on /verify", async () => {
    const { app } = await createResourcesApp(new CalculatorServer());
    try {
      const rewards: Record<string, number> = {};
      for (const [i, [expression, answer]] of ([
        ["1000000000 * 1000000000000", "1000000000000000000000"],
        ["9007199254740993", "9007199254740993"],
        ["4611686018427387904 + 1", "4611686018427387905"],
      ] as const).entries()) {
        const reply = await app.inject({ method: "POST", url: `/ng-rollout/r${i}/verify`, payload: { task: { expression }, answer } });
        rewards[`${expression} = ${answer}`] = reply.json().reward;
      }
      expect(rewards).toEqual({
        "1000000000 * 1000000000000 = 1000000000000000000000": 1,
        "9007199254740993 = 9007199254740993": 1,
        "4611686018427387904 + 1 = 4611686018427387905": 1,
      });
    } finally {
      await app.close();
    }
  });

  it("answers bad bodies and missing prefixes with catalog codes", async () => {
    const { app } = await createResourcesApp(new CalculatorServer());
    const extra = await app.inject({ method: "POST", url: "/ng-rollout/r1/tools/calculator", payload: { expression: "1+1", extra: 1 } });
    expect(extra.statusCode).toBe(400);
    expect(extra.json().error.code).toBe("invalid_request");
    const evil = await app.inject({ method: "POST", url: "/ng-rollout/r1/tools/calculator", payload: { expression: "require('fs')" } });
    expect(evil.json().error.code).toBe("invalid_request");
    const noPrefix = await app.inject({ method: "POST", url: "/verify", payload: {} });
    expect(noPrefix.statusCode).toBe(400);
    expect(noPrefix.json().error.code).toBe("rollout_id_required");
    const badKey = await app.inject({ method: "POST", url: "/ng-rollout/..%2Fetc/verify", payload: {} });
    expect(badKey.json().error.code).toBe("invalid_request");
    const badCookie = await app.inject({ method: "POST", url: "/ng-rollout/r1/tools/calculator", headers: { cookie: "ng_session=../../x" }, payload: { expression: "1" } });
    expect(badCookie.json().error.code).toBe("invalid_request");
    const badJson = await app.inject({ method: "POST", url: "/ng-rollout/r1/verify", headers: { "content-type": "application/json" }, payload: "{nope" });
    expect(badJson.json().error.code).toBe("invalid_request");
    await app.close();
  });

  it("restart-only servers mark the seed reply as a restart", async () => {
    const Server = calculatorServerClass("restart_only", "wait");
    const { app, kind } = await createResourcesApp(new Server());
    const seed = await app.inject({ method: "POST", url: "/ng-rollout/r1-a2/seed_session", payload: { task: { expression: "1" } } });
    expect(seed.headers["x-ng-checkpoint-verify"]).toBe("wait");
    expect(seed.headers["x-ng-checkpoint-restart"]).toBe("1");
    expect(kind.readiness().restarts).toEqual(["r1-a2"]);
    expect(kind.statusExtras()).toMatchObject({ mode: "restart_only", verify: "wait", retired_sessions: 0 });
    await app.close();
  });
});
