import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CodeVerifier } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: `args` are used as sent. JSON text `-0` parses to -0, but the job went to the
 * sandbox child as JSON.stringify's text, which writes -0 as `0`: a task testing `f(-0)` (sign of
 * zero, `1 / x`, `Object.is`) called the function with +0.
 */
const LIMITS = { memoryMb: 48, caseTimeoutMs: 1000, startupMs: 4000, maxCaseOutputChars: 64 * 1024 };

describe("code verifier: a -0 argument", () => {
  it("reaches the function as -0, inside arrays and objects too", async () => {
    const { app } = await createResourcesApp(new CodeVerifier(LIMITS));
    try {
      // Raw JSON text: JSON.stringify would write -0 as 0 before the verifier ever saw it.
      const payload = `{"task": {"function_name": "f", "tests": [
        {"args": [-0], "expected": "-0"}, {"args": [0], "expected": "0"},
        {"args": [[-0.0, {"z": -0e5}]], "expected": "-0,-0"}]},
        "answer": "function f(x) { const s = (v) => (Object.is(v, -0) ? '-0' : String(v)); return Array.isArray(x) ? s(x[0]) + ',' + s(x[1].z) : s(x); }"}`;
      const reply = await app.inject({ method: "POST", url: "/ng-rollout/r1/verify", headers: { "content-type": "application/json" }, payload });
      expect(reply.json()).toMatchObject({ cases: ["pass", "pass", "pass"], reward: 1 });
    } finally {
      await app.close();
    }
  });
});
