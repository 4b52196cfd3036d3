import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CalculatorServer } from "../../../participants/gym/resources-server/calculator-server.js";
import { MathVerifier, extractCode, normalizeAnswer, normalizeOutput } from "../../../participants/verifiers/index.js";

/**
 * A verifier judges in its only thread, which also answers the checkpoint control plane, so text a
 * model or a submission wrote must not make a pattern backtrack over it: each input below took
 * seconds to minutes with the patterns it replaced (quadratic backtracking), and must now finish at
 * once. The timeouts only guard against that hang; they are not speed targets.
 */
describe("inputs that made the verifiers' patterns backtrack", () => {
  it("math: long digit runs, dollar runs and zero runs before other text", { timeout: 10_000 }, () => {
    expect(normalizeAnswer(`${"1".repeat(99_990)}x`)).toBe(`${"1".repeat(99_990)}x`);
    expect(normalizeAnswer(`${"1 2 3 ".repeat(15_000)}...`)).toBe("1.23123123123e+44999");
    expect(normalizeAnswer(`${"$".repeat(99_990)}x`)).toBe("x");
    expect(normalizeAnswer(`1${"0".repeat(99_990)}1`)).toBe("1e+99991");
  });

  it("competitive: a long run of newlines before other output", { timeout: 10_000 }, () => {
    expect(normalizeOutput(`${"\n".repeat(300_000)}x\n\n`)).toBe(`${"\n".repeat(300_000)}x`);
  });

  it("code and competitive: an unclosed fence before a long whitespace run", { timeout: 10_000 }, () => {
    // Synchronous, so the test's timeout cannot end it: the elapsed time is the check (quadratic took seconds).
    const started = performance.now();
    expect(extractCode(`\`\`\`js${"\n".repeat(200_000)}x`)).toBe(`\`\`\`js${"\n".repeat(200_000)}x`);
    expect(extractCode(`\`\`\`${" \n".repeat(100_000)}`)).toBe(`\`\`\`${" \n".repeat(100_000)}`);
    expect(performance.now() - started).toBeLessThan(2_000);
    // The documented forms still hold: the first fenced block, its tag and leading blank lines dropped.
    expect(extractCode("text\n```js\n\n  f();\n```\n```\ng();\n```")).toBe("  f();\n");
    expect(extractCode("```javascript \r\nf();```")).toBe("f();");
    expect(extractCode("```jsx\nf();```")).toBe("```jsx\nf();```");
    expect(extractCode("f();")).toBe("f();");
  });

  it("resources middleware: an unrouted path of many slashes before other text is refused at once", { timeout: 10_000 }, async () => {
    const { app } = await createResourcesApp(new CalculatorServer());
    try {
      const seed = await app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", payload: {} });
      const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
      const reply = await app.inject({ method: "POST", url: `/ng-rollout/r1${"/".repeat(300_000)}x`, payload: {}, headers: { cookie } });
      expect(reply.statusCode).toBe(404);
    } finally {
      await app.close();
    }
  });
});

describe("math verifier numbers outside the double range", () => {
  const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

  it("compares them in decimal arithmetic, not as 0, Infinity or NaN", async () => {
    expect(await reward("0", "1e-400")).toBe(0);
    expect(await reward("1e-400", "10e-401")).toBe(1);
    expect(await reward("1e1001", "2e1001")).toBe(0);
    expect(await reward(`1${"0".repeat(400)}.5`, `9${"0".repeat(400)}.5`)).toBe(0);
    expect(await reward(`1${"0".repeat(400)}/3${"0".repeat(400)}`, `2${"0".repeat(400)}/7${"0".repeat(400)}`)).toBe(0);
    expect(await reward(`1${"0".repeat(400)}/3${"0".repeat(400)}`, "0.333333333333")).toBe(1);
  });

  it("keeps the documented forms: 12 significant digits, integers exactly, JavaScript's notation", () => {
    expect(normalizeAnswer("1/3")).toBe("0.333333333333");
    expect(normalizeAnswer("2.9999999999999")).toBe("3");
    expect(normalizeAnswer("99.99999999999999")).toBe("100");
    expect(normalizeAnswer("1e-6")).toBe("0.000001");
    expect(normalizeAnswer("1e-7")).toBe("1e-7");
    expect(normalizeAnswer("123456789012345678901234.5")).toBe("1.234567890123456789012345e+23");
    expect(normalizeAnswer("-1/2")).toBe("-0.5");
    expect(normalizeAnswer("5/0")).toBe("5/0");
    expect(normalizeAnswer("-0")).toBe("0");
  });

  it("removes `$`, spacing and trailing periods in any order", async () => {
    expect(normalizeAnswer("$42$.")).toBe("42");
    expect(normalizeAnswer(" $ 42 . $ ")).toBe("42");
    expect(await reward("42", "$42$.")).toBe(1);
  });
});
