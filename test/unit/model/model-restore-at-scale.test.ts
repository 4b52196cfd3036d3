import { afterEach, beforeEach, expect, it } from "vitest";
import type { ModelRecord } from "../../../participants/kinds/model/index.js";
import { chat, cutRecord, ledgerRow, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { countingVisits } from "../../support/read-counts.js";
import { ep } from "../../support/episode.js";

/**
 * A restore installs one model record per episode of its scope, and its clean-up retires attempt+1
 * of the whole scope: each record and each retired episode looked through every restored cut and
 * key, N² capture-key parses (2,000 episodes: 8 million, a second and more of event loop; 10,000: half a minute).
 */
const N = 300;

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture({ cuts: false });
});
afterEach(async () => {
  await f.close();
});

const records = (): ModelRecord[] =>
  Array.from({ length: N }, (_, i) => ({ episode_id: ep(`r${i}`), rows: [ledgerRow(`r${i}`, `mc-${i}`)], generation_cuts: [cutRecord(`r${i}`, chat("x"))] }));

const restoredState = () => f.kind as unknown as { restoredCuts: Map<string, unknown>; restoredKeys: Set<string>; freeing: Map<string, boolean> };

it("an install of N records visits the restored cuts O(N) times", async () => {
  const visits = countingVisits(restoredState().restoredCuts);
  await f.kind.install(records(), {});
  expect(visits()).toBeLessThanOrEqual(2 * N);
  expect(f.kind.statusExtras().restored_generation_cuts).toBe(N);
});

it("a retire of the N episodes a restore installed visits its restored state O(N) times, and drops it all", async () => {
  await f.kind.install(records(), {});
  const state = restoredState();
  const counters = [countingVisits(state.restoredCuts), countingVisits(state.restoredKeys), countingVisits(state.freeing)];
  await f.kind.retire(Array.from({ length: N }, (_, i) => ep(`r${i}`, 1)));
  expect(counters.reduce((sum, visits) => sum + visits(), 0)).toBeLessThanOrEqual(4 * N);
  expect(f.kind.statusExtras().restored_generation_cuts).toBe(0);
  expect(f.kind.hasLiveState()).toBe(false);
});
