import { createHash } from "node:crypto";
import { mkdir, readdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { RolloutRecordsSink } from "../../../coordinator/collect/rollout-records-sink.js";
import { RolloutStepMarkerSchema, encodeRolloutRecords, encodeRolloutStepMarker, type TraceRecord } from "../../../protocol/index.js";
import { ReplayTaskSource, checkIndex, completedFiles, readRecords, newReadStats, writeRolloutRecords } from "../../../participants/replay/index.js";
import { linearTrace, mathSource, silent, tempDir, traceId, type MathTask } from "./fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

async function waitFor(condition: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await condition()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`timed out waiting for ${what}`);
}

async function idsOf(file: string): Promise<string[]> {
  const out: string[] = [];
  const stats = newReadStats();
  for await (const r of readRecords(file, { filters: { minReward: null, maxReward: null, minBranches: 1 }, stats, useIndex: true, verifySha256: true, logger: silent })) out.push(r.trace.id);
  expect(stats.filesIndexed).toBe(1); // the index was accepted, sha256 included
  return out;
}

/** The ids in step N's eval file of env gym, in file order, once its index checks out against it (spans, size, sha256); records without nodes included. */
async function indexedIds(root: string, step: number): Promise<string[]> {
  const file = path.join(root, `step_${step}`, "eval_rollouts_gym.jsonl");
  const bytes = await readFile(file);
  const check = checkIndex(await readFile(path.join(root, `step_${step}`, "index_eval_gym.jsonl")), { recordFile: path.basename(file), kind: "eval", env: "gym", step, size: bytes.length });
  if (!check.ok) throw new Error(`step ${step}'s index: ${check.reason}`);
  expect(check.header.sha256).toBe(createHash("sha256").update(bytes).digest("hex"));
  const ids = bytes.toString("utf8").split("\n").filter(Boolean).map((line) => (JSON.parse(line) as { id: string }).id);
  expect(check.rows.map((row) => row.trace)).toEqual(ids);
  return ids;
}

describe("the collector's rollout-records sink", () => {
  // Every reader ignores a marker over MAX_ROLLOUT_STEP_MARKER_BYTES (1 MiB): a step whose marker
  // other collections filled takes no more files, the next step does. The limit is injected small.
  it("publishes into the next step when this step's marker could not list its file, so every marker stays one readers accept", async () => {
    const limit = Buffer.byteLength(encodeRolloutStepMarker(1, "eval", ["eval_rollouts_a.jsonl"])) + 10; // one name, not two
    const b = new RolloutRecordsSink({ dir, env: "b", kind: "eval", everyRows: 100, everySeconds: 600, maxMarkerBytes: limit }, silent);
    await b.start(); // would write step_1 next
    // Another collection has linked its step_1 file, and not yet written the marker (a marked step
    // takes no new file at all, full or not).
    const root = path.join(dir, "rollouts");
    await writeRolloutRecords(root, 1, { kind: "eval", env: "a", traces: [linearTrace(traceId(1))] });
    b.add(linearTrace(traceId(2)));
    await b.close();
    expect(await completedFiles(path.join(root, "step_2"))).toEqual(new Set(["eval_rollouts_b.jsonl"]));
    expect((await readdir(path.join(root, "step_1"))).sort()).toEqual(["eval_rollouts_a.jsonl", "index_eval_a.jsonl"]);
    expect(b.stats).toMatchObject({ steps: 1, records: 1, failedFlushes: 0, unwritten: 0 });
  });

  it("writes a step every K rows, on the timer, and at close; a restart continues after the highest step", async () => {
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 2, everySeconds: 0.05 }, silent);
    await sink.start();
    sink.add(linearTrace(traceId(1)));
    sink.add(linearTrace(traceId(2))); // K reached: step_1
    sink.add(linearTrace(traceId(3))); // alone: the timer writes step_2
    const root = path.join(dir, "rollouts");
    await waitFor(async () => (await readdir(root)).includes("step_2") && (await readdir(path.join(root, "step_2"))).includes("_complete_eval.json"), "the timer flush");
    expect(await idsOf(path.join(root, "step_1", "eval_rollouts_gym.jsonl"))).toEqual([traceId(1), traceId(2)]);
    expect(await idsOf(path.join(root, "step_2", "eval_rollouts_gym.jsonl"))).toEqual([traceId(3)]);
    const marker = RolloutStepMarkerSchema.parse(JSON.parse(await readFile(path.join(root, "step_1", "_complete_eval.json"), "utf8")));
    expect(marker).toEqual({ format: "gym-ckpt/rollout-step", version: 1, step: 1, kind: "eval", files: ["eval_rollouts_gym.jsonl"] });
    await sink.close();
    expect(sink.stats).toEqual({ steps: 2, records: 3, skipped: 0, failedFlushes: 0, unwritten: 0 });

    const again = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 100, everySeconds: 600 }, silent);
    await again.start();
    again.add(linearTrace(traceId(4)));
    await again.close(); // the final flush
    expect((await readdir(root)).sort()).toEqual(["step_1", "step_2", "step_3"]);
    expect(await idsOf(path.join(root, "step_3", "eval_rollouts_gym.jsonl"))).toEqual([traceId(4)]);
    expect((await readdir(path.join(root, "step_3"))).sort()).toEqual(["_complete_eval.json", "eval_rollouts_gym.jsonl", "index_eval_gym.jsonl"]); // no temp files
  });

  it("keeps records of a failed flush for the next one and never reuses the failed step", async () => {
    const root = path.join(dir, "rollouts");
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await sink.start();
    await writeFile(path.join(root, "step_1"), "a file where the step directory should go");
    sink.add(linearTrace(traceId(1)));
    await sink.flush();
    expect(sink.stats).toMatchObject({ steps: 0, failedFlushes: 1 });
    sink.add(linearTrace(traceId(2)));
    await sink.close();
    expect(sink.stats).toMatchObject({ steps: 1, records: 2, failedFlushes: 1 });
    expect(await idsOf(path.join(root, "step_2", "train_rollouts_gym.jsonl"))).toEqual([traceId(1), traceId(2)]);
  });

  it("close tries a failed final flush again (there is no later flush to take its rows)", async () => {
    const root = path.join(dir, "rollouts");
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 30 }, silent);
    await sink.start();
    await writeFile(path.join(root, "step_1"), "a stray file where the step directory should go");
    sink.add(linearTrace(traceId(1)));
    await sink.close();
    expect(sink.stats).toMatchObject({ steps: 1, records: 1, failedFlushes: 1, unwritten: 0 });
    expect(await idsOf(path.join(root, "step_2", "eval_rollouts_gym.jsonl"))).toEqual([traceId(1)]);
  });

  it("counts the records no try of close could write", async () => {
    const root = path.join(dir, "rollouts");
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 30 }, silent);
    await sink.start();
    for (const step of [1, 2, 3, 4, 5]) await writeFile(path.join(root, `step_${step}`), "in the way");
    sink.add(linearTrace(traceId(1)));
    sink.add(linearTrace(traceId(2)));
    await sink.close();
    expect(sink.stats).toMatchObject({ steps: 0, records: 0, failedFlushes: 3, unwritten: 2 });
  });

  it("a record that can never be encoded is dropped (counted as skipped), not kept back with every later record", async () => {
    const root = path.join(dir, "rollouts");
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 30 }, silent);
    await sink.start();
    sink.add(linearTrace(traceId(1)));
    const bad = linearTrace(traceId(2));
    (bad.task as Record<string, unknown>).seed = 1n; // JSON cannot encode it: no later flush could either
    sink.add(bad);
    sink.add(linearTrace(traceId(3)));
    await sink.flush();
    expect(sink.stats).toMatchObject({ steps: 1, records: 2, skipped: 1 });
    expect(await idsOf(path.join(root, "step_1", "eval_rollouts_gym.jsonl"))).toEqual([traceId(1), traceId(3)]);
    sink.add(linearTrace(traceId(4)));
    await sink.close();
    expect(sink.stats).toEqual({ steps: 2, records: 3, skipped: 1, failedFlushes: 0, unwritten: 0 });
    expect(await idsOf(path.join(root, "step_2", "eval_rollouts_gym.jsonl"))).toEqual([traceId(4)]);
  });

  // A batch whose record file or index passes one Buffer (4 GiB on Node 20) is refused by the
  // encoder, and was refused by every later flush too, which kept all its rows and every row after
  // them. The limit is injected small: a step file holds two of these records, or two index rows.
  describe("a batch too large for one step file is split into steps in a row, not refused by every flush", () => {
    const bare = (n: number): TraceRecord => ({ id: traceId(n), task: { idx: n, name: null, prompt: null }, nodes: [], rewards: {} });
    const cases = [
      ["its record file", (n: number) => linearTrace(traceId(n)), (two: ReturnType<typeof encodeRolloutRecords>) => two.recordBytes.length],
      ["its index (rows longer than the records)", bare, (two: ReturnType<typeof encodeRolloutRecords>) => two.indexBytes.length],
    ] as const;
    for (const [what, make, limitOf] of cases) {
      it(what, async () => {
        const two = encodeRolloutRecords({ kind: "eval", env: "gym", step: 1, records: [make(1), make(2)] });
        const limit = limitOf(two);
        expect(Math.max(two.recordBytes.length, two.indexBytes.length)).toBe(limit); // the other one fits
        const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 600, maxBatchBytes: limit }, silent);
        await sink.start();
        for (const n of [1, 2, 3, 4, 5]) sink.add(make(n));
        await sink.flush();
        expect(sink.stats).toEqual({ steps: 3, records: 5, skipped: 0, failedFlushes: 0, unwritten: 0 });
        const root = path.join(dir, "rollouts");
        const steps = [[1, 2], [3, 4], [5]];
        for (const [i, ids] of steps.entries()) {
          expect(await indexedIds(root, i + 1)).toEqual(ids.map(traceId));
          expect(await completedFiles(path.join(root, `step_${i + 1}`))).toEqual(new Set(["eval_rollouts_gym.jsonl"]));
        }
        // Later flushes go on as usual.
        sink.add(make(6));
        await sink.close();
        expect(sink.stats).toEqual({ steps: 4, records: 6, skipped: 0, failedFlushes: 0, unwritten: 0 });
        expect(await indexedIds(root, 4)).toEqual([traceId(6)]);
      });
    }

    it("a record no step file can hold alone is left out (counted as skipped), and the records around it are written", async () => {
      const limit = encodeRolloutRecords({ kind: "eval", env: "gym", step: 1, records: [linearTrace(traceId(1)), linearTrace(traceId(2))] }).recordBytes.length;
      const huge = linearTrace(traceId(2));
      huge.task = { ...huge.task, padding: "x".repeat(limit) };
      const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 600, maxBatchBytes: limit }, silent);
      await sink.start();
      for (const trace of [linearTrace(traceId(1)), huge, linearTrace(traceId(3)), linearTrace(traceId(4))]) sink.add(trace);
      await sink.close();
      expect(sink.stats).toEqual({ steps: 2, records: 3, skipped: 1, failedFlushes: 0, unwritten: 0 });
      const root = path.join(dir, "rollouts");
      expect((await readdir(root)).sort()).toEqual(["step_1", "step_2"]); // the step the left-out record would have taken goes to the records after it
      expect(await idsOf(path.join(root, "step_1", "eval_rollouts_gym.jsonl"))).toEqual([traceId(1)]);
      expect(await idsOf(path.join(root, "step_2", "eval_rollouts_gym.jsonl"))).toEqual([traceId(3), traceId(4)]);
    });

    it("a later part failing before it is published keeps its rows and the rest, in order, for the next flush; its step is not reused", async () => {
      const limit = encodeRolloutRecords({ kind: "eval", env: "gym", step: 1, records: [linearTrace(traceId(1)), linearTrace(traceId(2))] }).recordBytes.length;
      const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 600, maxBatchBytes: limit }, silent);
      await sink.start();
      const root = path.join(dir, "rollouts");
      // The second part ([3, 4], with [5] after it) cannot make its step directory.
      await writeFile(path.join(root, "step_2"), "a file where the step directory should go");
      for (const n of [1, 2, 3, 4, 5]) sink.add(linearTrace(traceId(n)));
      await sink.flush();
      expect(sink.stats).toEqual({ steps: 1, records: 2, skipped: 0, failedFlushes: 1, unwritten: 0 });
      sink.add(linearTrace(traceId(6)));
      await sink.close();
      // [3, 4, 5] and 6 after them: [3, 4] and [5, 6].
      expect(sink.stats).toEqual({ steps: 3, records: 6, skipped: 0, failedFlushes: 1, unwritten: 0 });
      expect((await readdir(root)).sort()).toEqual(["step_1", "step_2", "step_3", "step_4"]);
      const written: string[] = [];
      for (const step of [1, 3, 4]) {
        written.push(...(await indexedIds(root, step)));
        expect(await completedFiles(path.join(root, `step_${step}`))).toEqual(new Set(["eval_rollouts_gym.jsonl"]));
      }
      expect(written).toEqual([1, 2, 3, 4, 5, 6].map(traceId)); // each once, in the order they finished
    });

    it("a part whose step's marker is full (other collections) takes the next step, and the parts after it follow in order", async () => {
      const markerLimit = Buffer.byteLength(encodeRolloutStepMarker(1, "eval", ["eval_rollouts_a.jsonl"])) + 10; // one name, not two
      const limit = encodeRolloutRecords({ kind: "eval", env: "a", step: 1, records: [linearTrace(traceId(1)), linearTrace(traceId(2))] }).recordBytes.length;
      const a = new RolloutRecordsSink({ dir, env: "a", kind: "eval", everyRows: 64, everySeconds: 600, maxMarkerBytes: markerLimit, maxBatchBytes: limit }, silent);
      await a.start();
      // Another collection (env b) has linked its step_1 file, and not yet written the marker.
      const root = path.join(dir, "rollouts");
      await writeRolloutRecords(root, 1, { kind: "eval", env: "b", traces: [linearTrace(traceId(9))] });
      for (const n of [1, 2, 3, 4, 5]) a.add(linearTrace(traceId(n)));
      await a.close();
      expect((await readdir(path.join(root, "step_1"))).sort()).toEqual(["eval_rollouts_b.jsonl", "index_eval_b.jsonl"]);
      for (const [step, ids] of [[2, [1, 2]], [3, [3, 4]], [4, [5]]] as const) {
        expect(await completedFiles(path.join(root, `step_${step}`))).toEqual(new Set(["eval_rollouts_a.jsonl"]));
        expect(await idsOf(path.join(root, `step_${step}`, "eval_rollouts_a.jsonl"))).toEqual(ids.map(traceId));
      }
      expect(a.stats).toEqual({ steps: 3, records: 5, skipped: 0, failedFlushes: 0, unwritten: 0 });
    });
  });

  it("a record added after close is counted as not written (no later flush takes it), also across a second close", async () => {
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 30 }, silent);
    await sink.start();
    sink.add(linearTrace(traceId(1)));
    await sink.close();
    sink.add(linearTrace(traceId(2)));
    expect(sink.stats).toMatchObject({ steps: 1, records: 1, unwritten: 1 });
    await sink.close();
    expect(sink.stats).toMatchObject({ steps: 1, records: 1, unwritten: 1 });
  });

  it("a failed timer flush is tried again on the timer, without waiting for another row", async () => {
    const root = path.join(dir, "rollouts");
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "eval", everyRows: 64, everySeconds: 0.05 }, silent);
    await sink.start();
    await writeFile(path.join(root, "step_1"), "in the way");
    sink.add(linearTrace(traceId(1))); // the last row: nothing else arms the timer
    await waitFor(async () => sink.stats.steps === 1, "the retried timer flush");
    expect(sink.stats).toMatchObject({ steps: 1, records: 1, failedFlushes: 1 });
    expect(await idsOf(path.join(root, "step_2", "eval_rollouts_gym.jsonl"))).toEqual([traceId(1)]);
    await sink.close();
  });

  it("a flush that fails after its record file was published keeps the file (a follower may have read it): its rows count once, and the next flush writes the marker", async () => {
    const root = path.join(dir, "rollouts");
    const sink = new RolloutRecordsSink({ dir, env: "gym", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await sink.start();
    // The index cannot be written (a directory is in its way): the record file was already published.
    await mkdir(path.join(root, "step_1", "index_train_gym.jsonl"), { recursive: true });
    sink.add(linearTrace(traceId(1)));
    await sink.flush();
    expect(sink.stats).toMatchObject({ steps: 1, records: 1, failedFlushes: 1 });
    expect((await readdir(path.join(root, "step_1"))).sort()).toEqual(["index_train_gym.jsonl", "train_rollouts_gym.jsonl"]); // kept, no marker yet
    sink.add(linearTrace(traceId(2)));
    await sink.flush(); // writes step_1's marker before step_2
    expect((await readdir(path.join(root, "step_1"))).sort()).toEqual(["_complete_train.json", "index_train_gym.jsonl", "train_rollouts_gym.jsonl"]);
    await sink.close();
    expect(sink.stats).toEqual({ steps: 2, records: 2, skipped: 0, failedFlushes: 1, unwritten: 0 });
    expect(await idsOf(path.join(root, "step_2", "train_rollouts_gym.jsonl"))).toEqual([traceId(2)]); // traceId(1) is not written twice
    const follower = new ReplayTaskSource<MathTask, string, number>(
      { records: "rollouts/step_*/train_rollouts_*.jsonl", source: { id: "gsm8k" }, mode: "recheck", wait_for_step_marker: true },
      mathSource(),
      { cwd: dir, logger: silent },
    );
    await follower.load();
    expect(follower.tasks.map((t) => t.name)).toEqual(["recheck:00000001", "recheck:00000002"]);
  });

  it("a restart marks the step a killed flush left without its marker, so a marker-waiting follower reads past it", async () => {
    const root = path.join(dir, "rollouts");
    // SIGKILL between the record file (and its index) and the marker.
    await writeRolloutRecords(root, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(0xa), 0)] });
    const sink = new RolloutRecordsSink({ dir, env: "gsm8k", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await sink.start();
    sink.add(linearTrace(traceId(0xb), 0));
    await sink.close();
    const follower = new ReplayTaskSource<MathTask, string, number>(
      { records: "rollouts/step_*/train_rollouts_*.jsonl", source: { id: "gsm8k" }, mode: "recheck", wait_for_step_marker: true },
      mathSource(),
      { cwd: dir, logger: silent },
    );
    await follower.load();
    expect(follower.tasks.map((t) => t.name)).toEqual(["recheck:0000000a", "recheck:0000000b"]);
  });

  it("publishes into the next step when this step's marker of its kind is written without its file: a follower may have consumed the step", async () => {
    // Two collections of one records dir both start at step 1. a writes steps 1 and 2, each marked,
    // and a follower consumes them. b's flush then went into step 1 and re-marked it: the follower
    // took b's file after step 2, a cold loader sorted it into step 1, and the two numbered the
    // tasks differently (as writeStepRecords refuses, see record-writer).
    const root = path.join(dir, "rollouts");
    const follower = () =>
      new ReplayTaskSource<MathTask, string, number>(
        { records: "rollouts/step_*/train_rollouts_*.jsonl", source: { id: "gsm8k" }, mode: "recheck", wait_for_step_marker: true },
        mathSource(),
        { cwd: dir, logger: silent },
      );
    const a = new RolloutRecordsSink({ dir, env: "a", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    const b = new RolloutRecordsSink({ dir, env: "b", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await a.start();
    await b.start(); // both would write step_1 next
    for (const n of [0xa, 0xb]) {
      a.add(linearTrace(traceId(n), 0));
      await a.flush();
    }
    const early = follower();
    await early.load();
    expect(early.tasks.map((t) => t.name)).toEqual(["recheck:0000000a", "recheck:0000000b"]);
    const markerPath = path.join(root, "step_1", "_complete_train.json");
    const marker1 = await readFile(markerPath, "utf8");
    b.add(linearTrace(traceId(0xc), 0));
    await b.close();
    await a.close();
    expect(b.stats).toEqual({ steps: 1, records: 1, skipped: 0, failedFlushes: 0, unwritten: 0 });
    expect(await readFile(markerPath, "utf8")).toBe(marker1); // step 1 is left as the follower consumed it
    expect((await readdir(path.join(root, "step_1"))).sort()).toEqual(["_complete_train.json", "index_train_a.jsonl", "train_rollouts_a.jsonl"]);
    // Step 2 is marked too (a's), so b's file goes past it.
    expect(await completedFiles(path.join(root, "step_3"))).toEqual(new Set(["train_rollouts_b.jsonl"]));
    await early.reload();
    const cold = follower();
    await cold.load();
    expect(early.tasks.map((t) => t.name)).toEqual(["recheck:0000000a", "recheck:0000000b", "recheck:0000000c"]);
    expect(cold.tasks.map((t) => t.name)).toEqual(early.tasks.map((t) => t.name));
  });

  it("two collections writing into one records dir at the same time share a step they publish into before its marker, without replacing a file or a marker's entry", async () => {
    const root = path.join(dir, "rollouts");
    const sinks = ["a", "a"].map((env) => new RolloutRecordsSink({ dir, env, kind: "train", everyRows: 100, everySeconds: 600 }, silent));
    for (const sink of sinks) await sink.start(); // each starts at step 1
    // A collection of env b has linked its step_1 file, and not yet written the marker.
    await writeRolloutRecords(root, 1, { kind: "train", env: "b", traces: [linearTrace(traceId(0xb), 0)] });
    sinks.forEach((sink, i) => sink.add(linearTrace(traceId(0xa + 2 * i), 0)));
    for (const sink of sinks) await sink.flush();
    for (const sink of sinks) await sink.close();
    expect(sinks.map((s) => s.stats)).toEqual(sinks.map(() => ({ steps: 1, records: 1, skipped: 0, failedFlushes: 0, unwritten: 0 })));
    // envs a and b share step_1 (its marker lists both); the second collection of env a finds its
    // file taken (the marker lists that name: not a new file, the link refuses it) and writes step_2
    const marker1 = RolloutStepMarkerSchema.parse(JSON.parse(await readFile(path.join(root, "step_1", "_complete_train.json"), "utf8")));
    expect(marker1.files).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
    expect(await idsOf(path.join(root, "step_1", "train_rollouts_a.jsonl"))).toEqual([traceId(0xa)]);
    expect(await idsOf(path.join(root, "step_1", "train_rollouts_b.jsonl"))).toEqual([traceId(0xb)]);
    expect(await idsOf(path.join(root, "step_2", "train_rollouts_a.jsonl"))).toEqual([traceId(0xc)]);
    const follower = new ReplayTaskSource<MathTask, string, number>(
      { records: "rollouts/step_*/train_rollouts_*.jsonl", source: { id: "gsm8k" }, mode: "recheck", wait_for_step_marker: true },
      mathSource(),
      { cwd: dir, logger: silent },
    );
    await follower.load();
    expect(follower.tasks.map((t) => t.name)).toEqual(["recheck:0000000a", "recheck:0000000b", "recheck:0000000c"]);
  });

  it("a start completes a marker that lists fewer record files of its kind than the step holds (a concurrent writer's lost update)", async () => {
    const root = path.join(dir, "rollouts");
    await writeRolloutRecords(root, 1, { kind: "train", env: "a", traces: [linearTrace(traceId(0xa), 0)] });
    await writeRolloutRecords(root, 1, { kind: "train", env: "b", traces: [linearTrace(traceId(0xb), 0)] });
    const short = { format: "gym-ckpt/rollout-step", version: 1, step: 1, kind: "train", files: ["train_rollouts_b.jsonl"] };
    await writeFile(path.join(root, "step_1", "_complete_train.json"), `${JSON.stringify(short)}\n`);
    const sink = new RolloutRecordsSink({ dir, env: "a", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await sink.start();
    await sink.close();
    const marker = RolloutStepMarkerSchema.parse(JSON.parse(await readFile(path.join(root, "step_1", "_complete_train.json"), "utf8")));
    expect(marker.files).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
  });

  it("a start completes a marker that lists one record file twice and leaves another out (a count would take it as complete)", async () => {
    const root = path.join(dir, "rollouts");
    await writeRolloutRecords(root, 1, { kind: "train", env: "a", traces: [linearTrace(traceId(0xa), 0)] });
    await writeRolloutRecords(root, 1, { kind: "train", env: "b", traces: [linearTrace(traceId(0xb), 0)] });
    const twice = { format: "gym-ckpt/rollout-step", version: 1, step: 1, kind: "train", files: ["train_rollouts_b.jsonl", "train_rollouts_b.jsonl"] };
    await writeFile(path.join(root, "step_1", "_complete_train.json"), `${JSON.stringify(twice)}\n`);
    const sink = new RolloutRecordsSink({ dir, env: "a", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await sink.start();
    await sink.close();
    const marker = RolloutStepMarkerSchema.parse(JSON.parse(await readFile(path.join(root, "step_1", "_complete_train.json"), "utf8")));
    expect(marker.files).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
  });

  it("a start rewrites a marker of another step found in a step (copied in), which no follower takes for that step's", async () => {
    const root = path.join(dir, "rollouts");
    await writeRolloutRecords(root, 1, { kind: "train", env: "a", traces: [linearTrace(traceId(0xa), 0)] });
    const copied = { format: "gym-ckpt/rollout-step", version: 1, step: 7, kind: "train", files: ["train_rollouts_a.jsonl"] };
    await writeFile(path.join(root, "step_1", "_complete_train.json"), `${JSON.stringify(copied)}\n`);
    const sink = new RolloutRecordsSink({ dir, env: "a", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await sink.start();
    await sink.close();
    const marker = RolloutStepMarkerSchema.parse(JSON.parse(await readFile(path.join(root, "step_1", "_complete_train.json"), "utf8")));
    expect(marker).toMatchObject({ step: 1, files: ["train_rollouts_a.jsonl"] });
  });

  it("refuses an env name that is not a safe file-name component", () => {
    expect(() => new RolloutRecordsSink({ dir, env: "a/b", kind: "train", everyRows: 1, everySeconds: 1 }, silent)).toThrow(/env name/);
  });
});
