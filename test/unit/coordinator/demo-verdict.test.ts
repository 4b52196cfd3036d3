import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { readResults } from "../../../coordinator/collect/results-file.js";
import { verifyCalls, verifyRows, type BackendCall } from "../../../coordinator/local/demo.js";

const call = (capture_key: string, model_call_id: string, message_count: number, fields: Partial<BackendCall> = {}): BackendCall => ({
  capture_key,
  model_call_id,
  continued_from: null,
  message_count,
  delivered: true,
  aborted: false,
  tokens_emitted: 3,
  ...fields,
});

describe("the demo's verdict on backend calls", () => {
  it("counts a delivered call made again from scratch as repeated", () => {
    const calls = [call("r1", "mc-1", 2), call("r1", "mc-2", 4), call("r1-a1", "mc-3", 4)];
    expect(verifyCalls(calls)).toMatchObject({ delivered: 3, repeated: 1 });
  });

  it("does not count the continuation of a cut call (it reuses the cut prefix) as repeated", () => {
    // The crash checkpoint cut mc-2: the backend finished writing it, the Gym never got it.
    const calls = [call("r1", "mc-1", 2), call("r1", "mc-2", 4, { tokens_emitted: 1 }), call("r1-a1", "mc-3", 4, { continued_from: "mc-2" })];
    expect(verifyCalls(calls)).toMatchObject({ delivered: 3, repeated: 0, keptByContinuation: 2 });
  });

  it("a continuation naming another call than the delivered one is still a repeat", () => {
    const calls = [call("r1", "mc-1", 2), call("r1", "mc-2", 4), call("r1-a1", "mc-3", 4, { continued_from: "mc-1" })];
    expect(verifyCalls(calls).repeated).toBe(1);
  });
});

describe("the demo's verdict on finished rows", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "gym-ckpt-demo-rows-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });
  const row = (rollout_id: string, attempt = 0) => `${JSON.stringify({ rollout_id, attempt, reward: 1, continued: false, finished_at: 1, response: {} })}\n`;

  it("a row written twice is repeated, though one row per id still counts every task finished", async () => {
    const out = join(dir, "results.jsonl");
    await writeFile(out, row("demo-000") + row("demo-001") + row("demo-001", 1));
    expect((await readResults(out)).size).toBe(2); // what the demo used to compare with --rows
    expect(await verifyRows(out, ["demo-000", "demo-001"])).toEqual({ finished: 2, missing: 0, repeated: 1, unknown: 0 });
  });

  it("a row no task names does not stand in for a missing one", async () => {
    const out = join(dir, "results.jsonl");
    await writeFile(out, row("demo-000") + row("other-7"));
    expect((await readResults(out)).size).toBe(2);
    expect(await verifyRows(out, ["demo-000", "demo-001"])).toEqual({ finished: 1, missing: 1, repeated: 0, unknown: 1 });
  });

  it("no results file: every row missing", async () => {
    expect(await verifyRows(join(dir, "absent.jsonl"), ["demo-000"])).toEqual({ finished: 0, missing: 1, repeated: 0, unknown: 0 });
  });
});
