import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CalculatorServer } from "../../../participants/gym/resources-server/calculator-server.js";

/**
 * The calculator's /verify refused an answer longer than 10,000 characters with invalid_request: a
 * policy that answers at length (a reasoning model's thinking left in its content) failed the
 * whole episode's /run with the caller's-fault code, after every policy and tool call had run,
 * instead of scoring the wrong answer 0. No longer answer can equal a result the calculator prints
 * (at most a double's range, digit for digit); the server's body limit still bounds it.
 */
describe("calculator /verify, a long answer", () => {
  it("is scored (0 when wrong, 1 when it trims to the result), not refused", async () => {
    const { app } = await createResourcesApp(new CalculatorServer());
    try {
      const long = `<think>${"let me compute 6 * 7 carefully. ".repeat(600)}</think> 42`;
      expect(long.length).toBeGreaterThan(10_000);
      const verify = (key: string, answer: string) => app.inject({ method: "POST", url: `/ng-rollout/${key}/verify`, payload: { task: { expression: "6 * 7" }, answer } });
      const wrong = await verify("r1", long);
      expect([wrong.statusCode, wrong.json()]).toEqual([200, { reward: 0 }]);
      const padded = await verify("r2", `${" ".repeat(20_000)}42\n`);
      expect([padded.statusCode, padded.json()]).toEqual([200, { reward: 1 }]);
    } finally {
      await app.close();
    }
  });
});
