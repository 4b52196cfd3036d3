import { afterEach, beforeEach, expect, it } from "vitest";
import { deliveredCall, emptyRecords, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture({ cuts: false });
});
afterEach(async () => {
  await f.close();
});

it("a commit scope naming a fenced attempt exports no record of it, though its ledger is still held (its retire cut short, a late install's free waiting for resume)", async () => {
  await deliveredCall(f.kind, "r1");
  await deliveredCall(f.kind, "r2");
  // Fenced by the control plane; the kind's retire has not removed its ledger yet.
  f.retired.add("r1#0");
  const records = await f.kind.exportRecords([ep("r1"), ep("r2"), ep("r3")]);
  // A restore of it would continue the retired r1 as r1-a1 from its rows.
  expect(records.map((r) => ({ key: r.episode_id.rollout_id, rows: r.rows.length }))).toEqual([
    { key: "r2", rows: 1 },
    { key: "r3", rows: 0 },
  ]);
  expect(records[1]).toEqual(emptyRecords(ep("r3"))[0]);
});
