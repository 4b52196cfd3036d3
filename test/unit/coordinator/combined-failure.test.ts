import { describe, expect, it } from "vitest";
import { combinedFailure } from "../../../coordinator/engine/participant-client.js";

/**
 * The summary of several failed participant outcomes names each participant once per detail: a
 * transport failure's detail already starts with the participant (it also stands alone in the
 * reply's `failures`), a participant's own refusal does not.
 */
describe("combinedFailure", () => {
  it("does not name a participant twice when its detail already starts with its name", () => {
    const error = combinedFailure("restore", [
      { participant: { kind: "environment", instance: "env" }, code: "unreachable", detail: "environment/env: no responders on gym.ckpt.v1.default.p.environment.env.restore" },
      { participant: { kind: "resources", instance: "counter" }, code: "stale_checkpoint", detail: "checkpoint was already resumed" },
    ]);
    expect(error.message).toBe(
      "restore failed on 2 participant(s): environment/env: unreachable, resources/counter: stale_checkpoint; first details: environment/env: no responders on gym.ckpt.v1.default.p.environment.env.restore; resources/counter: checkpoint was already resumed",
    );
    // The reply's failures keep each detail as it was.
    expect((error.data as { failures: { detail: string }[] }).failures.map((f) => f.detail)).toEqual([
      "environment/env: no responders on gym.ckpt.v1.default.p.environment.env.restore",
      "checkpoint was already resumed",
    ]);
  });
});
