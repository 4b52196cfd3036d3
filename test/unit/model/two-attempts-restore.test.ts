import { afterEach, beforeEach, expect, it } from "vitest";
import { emptyRecords, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { refusalOf } from "../../support/refusal.js";
import { ep } from "../../support/episode.js";

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture({ cuts: false });
});
afterEach(async () => {
  await f.close();
});

it("restore refuses records holding one rollout at two attempts (invalid_checkpoint_state naming both), installing nothing", async () => {
  // Installed in order, r1-a1's record would remove the r1-a1 ledger r1-a0's record had just installed.
  const records = emptyRecords(ep("r2"), ep("r1"), ep("r1", 1));
  const refusal = await refusalOf(f.kind.install(records, {}));
  expect(refusal.code).toBe("invalid_checkpoint_state");
  expect(refusal.message).toContain("rollout r1 at attempts 0 and 1");
  expect(f.kind.hasLiveState()).toBe(false);
});

it("a commit scope naming one rollout at two attempts exports the current (highest) attempt alone", async () => {
  const records = await f.kind.exportRecords([ep("r1"), ep("r2"), ep("r1", 1)]);
  expect(records.map((r) => `${r.episode_id.rollout_id}-a${r.episode_id.attempt}`)).toEqual(["r2-a0", "r1-a1"]);
});
