import { describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { MathVerifier } from "../../../participants/verifiers/index.js";

/**
 * A math task whose expected answer is no number (a fraction over zero: `1/0`, `\frac{1}{0}`, `0/0`)
 * was compared as text, so only a model that wrote the same division by zero scored 1. Such a task,
 * like one whose expected answer is empty once normalized, is refused with invalid_request; and the
 * reference agent sends the task with `/seed_session` before any policy call, so the seed refuses it
 * there already (starting no session), not only `/verify` after the episode spent its model calls.
 */
describe("math verifier: an expected answer that divides by zero", () => {
  const zeroDivisions = ["1/0", "-1/0", "0/0", "1/000", "\\frac{1}{0}", "-\\frac{3}{0}", "\\dfrac10", "$\\boxed{2/0}$", "1/0%"];

  it("is refused at verify with invalid_request naming the expected answer, whatever the answer", async () => {
    for (const expected_answer of zeroDivisions) {
      for (const answer of [expected_answer, "0", "\\infty"]) {
        const refusal = await new MathVerifier().verify({ task: { expected_answer }, answer }).catch((error: unknown) => error);
        expect(refusal, JSON.stringify({ expected_answer, answer })).toBeInstanceOf(CheckpointError);
        expect((refusal as CheckpointError).code).toBe("invalid_request");
        expect((refusal as CheckpointError).message).toContain(`task.expected_answer ${JSON.stringify(expected_answer)}`);
      }
    }
  });

  // Such a division before a unit was still compared as text (`1/0 m`): the unit hid it from the check.
  it("is refused with a unit after it too, at verify and at the seed", async () => {
    const withUnits = ["1/0\\text{ m}", "\\frac{1}{0}\\,\\mathrm{km/h}", "$\\boxed{0/0\\text{ cm}}$", "1/0^\\circ", "-1/0°C", "1/0\\text{ degrees}",
      // The number inside the wrapper, and the word degrees in plain text, after the number or the `$` or brace closing it.
      "\\text{1/0 m}", "1/0 degrees", "\\text{1/0 degrees}", "$1/0$ degrees", "\\frac{1}{0} degrees", "$\\frac{1}{0}$ degrees"];
    for (const expected_answer of withUnits) {
      const refusal = await new MathVerifier().verify({ task: { expected_answer }, answer: expected_answer }).catch((error: unknown) => error);
      expect(refusal, expected_answer).toBeInstanceOf(CheckpointError);
      expect((refusal as CheckpointError).code).toBe("invalid_request");
      expect((refusal as CheckpointError).message).toContain("divides by zero");
    }
    const { app } = await createResourcesApp(new MathVerifier());
    try {
      const reply = await app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", payload: { task: { expected_answer: "1/0\\text{ m}" } } });
      expect({ status: reply.statusCode, code: reply.json().error?.code }).toEqual({ status: 400, code: "invalid_request" });
    } finally {
      await app.close();
    }
    // A sound number before a unit, and a division by zero that is no number before a unit (a hedge), are left alone.
    expect((await new MathVerifier().verify({ task: { expected_answer: "1/2\\text{ m}" }, answer: "0.5" })).reward).toBe(1);
    expect((await new MathVerifier().verify({ task: { expected_answer: "1/0\\text{ or 7}" }, answer: "7" })).reward).toBe(0);
  });

  it("leaves other answers alone: a non-zero denominator, a zero numerator, infinity written out, a division that is text", async () => {
    const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;
    expect(await reward("1/10", "0.1")).toBe(1);
    expect(await reward("0/5", "0")).toBe(1);
    expect(await reward("\\infty", "\\infty")).toBe(1);
    expect(await reward("10/0.5", "10/0.5")).toBe(1);
  });

  it("is refused at /seed_session when the seed carries the task, before a session starts; a sound task seeds", async () => {
    const { app } = await createResourcesApp(new MathVerifier());
    try {
      const seed = (task: unknown) => app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", payload: { task } });
      for (const expected_answer of ["1/0", "\\frac{1}{0}", "", "$$"]) {
        const reply = await seed({ expected_answer, question: "q" });
        expect({ status: reply.statusCode, code: reply.json().error?.code, cookie: reply.headers["set-cookie"] }, expected_answer).toEqual({ status: 400, code: "invalid_request", cookie: undefined });
        expect(reply.json().error.detail).toContain(`task.expected_answer ${JSON.stringify(expected_answer)}`);
      }
      // A task verify would refuse for its shape is refused at the seed too; a seed without a task is not checked.
      expect((await seed({ question: "no expected answer" })).json().error?.code).toBe("invalid_request");
      const sound = await seed({ expected_answer: "1/2", question: "q" });
      expect(sound.statusCode).toBe(200);
      expect(sound.headers["set-cookie"]).toBeDefined();
      expect((await app.inject({ method: "POST", url: "/ng-rollout/r2/seed_session", payload: {} })).statusCode).toBe(200);
    } finally {
      await app.close();
    }
  });
});
