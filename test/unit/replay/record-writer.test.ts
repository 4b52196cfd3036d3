import { constants } from "node:buffer";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import { mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  encodeRecords,
  IndexHeaderSchema,
  IndexRowSchema,
  RecordWriter,
  ReplayError,
  ReplayTaskSource,
  StepMarkerSchema,
  TraceRecordSchema,
  writeRolloutRecords,
  writeStepRecords,
  type TraceRecord,
} from "../../../participants/replay/index.js";
import { encodeRolloutRecords } from "../../../protocol/index.js";
import { compactedTrace, linearTrace, mathSource, silent, tempDir, traceId } from "./fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(async () => {
  vi.restoreAllMocks();
  await cleanup();
});

async function readIndex(indexPath: string) {
  const lines = (await readFile(indexPath, "utf8")).trimEnd().split("\n").map((l) => JSON.parse(l) as unknown);
  return { header: IndexHeaderSchema.parse(lines[0]), rows: lines.slice(1).map((l) => IndexRowSchema.parse(l)) };
}

describe("record writer", () => {
  it("writes step_<N>/<kind>_rollouts_<env>.jsonl and an index pinning name, size and sha256", async () => {
    const traces = [linearTrace(traceId(1), 0), compactedTrace(traceId(2), 1)];
    traces[0]!.stop_condition = "max_turns";
    const written = await writeRolloutRecords(dir, 3, { kind: "train", env: "gsm8k", traces, policyVersion: (_t, i) => 5 + i });
    expect(written.recordPath).toBe(path.join(dir, "step_3", "train_rollouts_gsm8k.jsonl"));
    expect(written.indexPath).toBe(path.join(dir, "step_3", "index_train_gsm8k.jsonl"));
    const data = await readFile(written.recordPath);
    const { header, rows } = await readIndex(written.indexPath);
    expect(header).toEqual({
      format: "gym-ckpt/rollout-index",
      version: 1,
      kind: "train",
      env: "gsm8k",
      step: 3,
      record_file: "train_rollouts_gsm8k.jsonl",
      size: data.length,
      sha256: createHash("sha256").update(data).digest("hex"),
      records: 2,
    });
    expect(rows.map(({ offset: _o, len: _l, ...rest }) => rest)).toEqual([
      { trace: traceId(1), task_idx: 0, task_name: "gsm8k", reward: 0, policy_version: 5, step: 3, branches: 1, turns: 1, stop: "max_turns" },
      { trace: traceId(2), task_idx: 0, task_name: "gsm8k", reward: 1, policy_version: 6, step: 3, branches: 2, turns: 4, stop: null },
    ]);
    // Spans tile the file and each holds exactly one record line, newline included.
    expect(rows[0]!.offset).toBe(0);
    expect(rows[1]!.offset).toBe(rows[0]!.len);
    expect(rows[1]!.offset + rows[1]!.len).toBe(data.length);
    rows.forEach((row, i) => {
      const span = data.subarray(row.offset, row.offset + row.len);
      expect(span.at(-1)).toBe(0x0a);
      expect(JSON.parse(span.toString("utf8"))).toEqual(traces[i]);
    });
  });

  it("computes spans on bytes, so UTF-8 multibyte content shifts later spans correctly", async () => {
    const wide = linearTrace(traceId(1));
    wide.nodes[1]!.message = { role: "user", content: "Combien font 6×7 ? 漢字 🙂 é" };
    const traces = [wide, linearTrace(traceId(2)), linearTrace(traceId(3))];
    const { recordPath, indexPath } = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces });
    const { rows } = await readIndex(indexPath);
    const firstLine = JSON.stringify(wide) + "\n";
    expect(rows[0]!.len).toBe(Buffer.byteLength(firstLine));
    expect(rows[0]!.len).toBeGreaterThan(firstLine.length); // string length would be wrong
    const data = await readFile(recordPath);
    for (const [i, row] of rows.entries()) {
      expect(TraceRecordSchema.parse(JSON.parse(data.subarray(row.offset, row.offset + row.len).toString("utf8"))).id).toBe(traceId(i + 1));
    }
  });

  it("gives eval files their own index name (no train/eval collision)", async () => {
    await writeStepRecords(dir, 1, [
      { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1))] },
      { kind: "eval", env: "gsm8k", traces: [linearTrace(traceId(2)), linearTrace(traceId(3))] },
    ]);
    const files = (await readdir(path.join(dir, "step_1"))).sort();
    expect(files).toEqual([
      "_complete_eval.json",
      "_complete_train.json",
      "eval_rollouts_gsm8k.jsonl",
      "index_eval_gsm8k.jsonl",
      "index_train_gsm8k.jsonl",
      "train_rollouts_gsm8k.jsonl",
    ]); // no temp files left behind
    expect((await readIndex(path.join(dir, "step_1", "index_eval_gsm8k.jsonl"))).header.records).toBe(2);
    expect((await readIndex(path.join(dir, "step_1", "index_train_gsm8k.jsonl"))).header.record_file).toBe("train_rollouts_gsm8k.jsonl");
  });

  it("writes all envs of a step, then a step-complete marker per kind", async () => {
    const envs = ["a", "b", "c"].map((env, i) => ({ kind: "train" as const, env, traces: [linearTrace(traceId(i))] }));
    const written = await writeStepRecords(dir, 12, envs);
    expect(written.map((w) => path.basename(w.recordPath))).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl", "train_rollouts_c.jsonl"]);
    const marker = StepMarkerSchema.parse(JSON.parse(await readFile(path.join(dir, "step_12", "_complete_train.json"), "utf8")));
    expect(marker).toEqual({ format: "gym-ckpt/rollout-step", version: 1, step: 12, kind: "train", files: ["train_rollouts_a.jsonl", "train_rollouts_b.jsonl", "train_rollouts_c.jsonl"] });
  });

  it("rewrites a marker of another step or kind found in the step, which no follower takes for this step's", async () => {
    await mkdir(path.join(dir, "step_4"), { recursive: true });
    const markerPath = path.join(dir, "step_4", "_complete_train.json");
    // Step 3's marker copied into step 4 lists the very file step 4 is about to hold.
    await writeFile(markerPath, JSON.stringify({ format: "gym-ckpt/rollout-step", version: 1, step: 3, kind: "train", files: ["train_rollouts_a.jsonl"] }));
    await writeStepRecords(dir, 4, [{ kind: "train", env: "a", traces: [linearTrace(traceId(1))] }]);
    expect(StepMarkerSchema.parse(JSON.parse(await readFile(markerPath, "utf8")))).toMatchObject({ step: 4, kind: "train", files: ["train_rollouts_a.jsonl"] });
    await writeFile(markerPath, JSON.stringify({ format: "gym-ckpt/rollout-step", version: 1, step: 4, kind: "eval", files: ["train_rollouts_a.jsonl"] }));
    await writeStepRecords(dir, 4, [{ kind: "train", env: "a", traces: [linearTrace(traceId(1))] }]); // a retry
    expect(StepMarkerSchema.parse(JSON.parse(await readFile(markerPath, "utf8")))).toMatchObject({ step: 4, kind: "train", files: ["train_rollouts_a.jsonl"] });
  });

  // The marker schema allows a name listed twice; counting names then took [a, a] for a list of a and b.
  it("completes a marker that lists one file twice, so the step's other file is not left unlisted for good", async () => {
    await writeRolloutRecords(dir, 6, { kind: "train", env: "a", traces: [linearTrace(traceId(1))] });
    const markerPath = path.join(dir, "step_6", "_complete_train.json");
    await writeFile(markerPath, JSON.stringify({ format: "gym-ckpt/rollout-step", version: 1, step: 6, kind: "train", files: ["train_rollouts_a.jsonl", "train_rollouts_a.jsonl"] }));
    await writeStepRecords(dir, 6, [{ kind: "train", env: "b", traces: [linearTrace(traceId(2))] }]);
    expect(StepMarkerSchema.parse(JSON.parse(await readFile(markerPath, "utf8"))).files).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
  });

  // Every reader ignores a marker over MAX_ROLLOUT_STEP_MARKER_BYTES (1 MiB, a few thousand envs):
  // one written anyway leaves the step incomplete for followers for good. The limit is injected small.
  it("refuses a step whose marker would be larger than readers accept, invalid_request, before publishing any file", async () => {
    await writeStepRecords(dir, 5, [{ kind: "train", env: "a", traces: [linearTrace(traceId(1))] }]);
    const markerPath = path.join(dir, "step_5", "_complete_train.json");
    const before = await readFile(markerPath, "utf8");
    const limit = Buffer.byteLength(before) + 10; // room for no second file name
    const envs = ["b", "c"].map((env, i) => ({ kind: "train" as const, env, traces: [linearTrace(traceId(i + 2))] }));
    await expect(writeStepRecords(dir, 5, envs, limit)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("every reader accepts") });
    expect((await readdir(path.join(dir, "step_5"))).sort()).toEqual(["_complete_train.json", "index_train_a.jsonl", "train_rollouts_a.jsonl"]);
    expect(await readFile(markerPath, "utf8")).toBe(before);
    // Within the limit (here, the writer's default) the same call goes ahead.
    await writeStepRecords(dir, 5, envs);
    expect(StepMarkerSchema.parse(JSON.parse(await readFile(markerPath, "utf8"))).files).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl", "train_rollouts_c.jsonl"]);
  });

  it("keeps every file of a step written in several calls in its marker, and never replaces a published file", async () => {
    await writeStepRecords(dir, 3, [{ kind: "train", env: "a", traces: [linearTrace(traceId(1))] }]);
    await writeStepRecords(dir, 3, [{ kind: "train", env: "b", traces: [linearTrace(traceId(2))] }]);
    const markerPath = path.join(dir, "step_3", "_complete_train.json");
    expect(StepMarkerSchema.parse(JSON.parse(await readFile(markerPath, "utf8"))).files).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
    const before = await readFile(path.join(dir, "step_3", "train_rollouts_a.jsonl"));
    const error = await writeStepRecords(dir, 3, [{ kind: "train", env: "a", traces: [linearTrace(traceId(9))] }]).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect((error as ReplayError).code).toBe("invalid_request");
    expect(await readFile(path.join(dir, "step_3", "train_rollouts_a.jsonl"))).toEqual(before);
  });

  describe("a step interrupted after publishing some of its files (ENOSPC or a crash before the marker)", () => {
    const a = () => ({ kind: "train" as const, env: "a", traces: [linearTrace(traceId(1))] });
    const b = () => ({ kind: "train" as const, env: "b", traces: [linearTrace(traceId(2))] });
    const stepDir = () => path.join(dir, "step_0");
    const markerFiles = async (kind = "train") =>
      StepMarkerSchema.parse(JSON.parse(await readFile(path.join(stepDir(), `_complete_${kind}.json`), "utf8"))).files;
    // What the interrupted writeStepRecords(dir, 0, [a, b]) left: a and its index, no b, no marker.
    const interrupted = () => writeRolloutRecords(dir, 0, a());

    it("completing it with only the missing file marks every file of the step, so a follower's prefix includes a", async () => {
      await interrupted();
      await writeStepRecords(dir, 0, [b()]);
      expect(await markerFiles()).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
    });

    it("retrying the whole step accepts the identical published file, restores a missing index and marks both", async () => {
      const { recordPath, indexPath } = await interrupted();
      const published = await readFile(recordPath);
      const index = await readFile(indexPath);
      await rm(indexPath); // the crash can also fall between a record file and its index
      const written = await writeStepRecords(dir, 0, [a(), b()]);
      expect(written.map((w) => [path.basename(w.recordPath), w.records, w.bytes])).toEqual([
        ["train_rollouts_a.jsonl", 1, published.length],
        ["train_rollouts_b.jsonl", 1, (await readFile(path.join(stepDir(), "train_rollouts_b.jsonl"))).length],
      ]);
      expect(await readFile(recordPath)).toEqual(published);
      expect(await readFile(indexPath)).toEqual(index);
      expect(await markerFiles()).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
      // A retry after the step completed is a no-op, too.
      await writeStepRecords(dir, 0, [a(), b()]);
      expect(await markerFiles()).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
    });

    it("a call that fails part-way writes no marker, and retrying it once the fault is gone completes the step", async () => {
      const blocker = path.join(stepDir(), "index_train_b.jsonl");
      await mkdir(blocker, { recursive: true }); // b's index cannot be published (stands in for ENOSPC)
      await expect(writeStepRecords(dir, 0, [a(), b()])).rejects.toThrow();
      expect((await readdir(stepDir())).sort()).toEqual(["index_train_a.jsonl", "index_train_b.jsonl", "train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
      await rm(blocker, { recursive: true });
      await writeStepRecords(dir, 0, [a(), b()]);
      expect(await markerFiles()).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
      expect((await readIndex(path.join(stepDir(), "index_train_b.jsonl"))).header.record_file).toBe("train_rollouts_b.jsonl");
    });

    it("a retry replaces a FIFO standing where the index belongs instead of blocking on it", { timeout: 5000 }, async () => {
      const { indexPath } = await interrupted();
      const index = await readFile(indexPath);
      await rm(indexPath);
      execFileSync("mkfifo", [indexPath]); // readers ignore it unread; the retry must not wait for a writer either
      await writeStepRecords(dir, 0, [a(), b()]);
      expect(await readFile(indexPath)).toEqual(index);
      expect(await markerFiles()).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
    });

    it("retrying with different content for a published file is refused as before and changes nothing", async () => {
      const { recordPath } = await interrupted();
      const before = (await readdir(stepDir())).sort();
      const published = await readFile(recordPath);
      const changed = { ...a(), traces: [linearTrace(traceId(9))] };
      const error = await writeStepRecords(dir, 0, [changed, b()]).then(() => null, (e: unknown) => e);
      expect(error).toBeInstanceOf(ReplayError);
      expect((error as ReplayError).code).toBe("invalid_request");
      expect((error as ReplayError).message).toContain("already has train_rollouts_a.jsonl");
      expect(await readFile(recordPath)).toEqual(published);
      expect((await readdir(stepDir())).sort()).toEqual(before);
    });

    it("marks a file of another kind the interrupted call published, so it cannot block a follower either", async () => {
      await writeRolloutRecords(dir, 0, { kind: "eval", env: "c", traces: [linearTrace(traceId(3))] });
      await writeStepRecords(dir, 0, [a()]);
      expect(await markerFiles("train")).toEqual(["train_rollouts_a.jsonl"]);
      expect(await markerFiles("eval")).toEqual(["eval_rollouts_c.jsonl"]);
    });
  });

  it("refuses bad input before writing anything", async () => {
    const withTask = (extra: Record<string, unknown>) => {
      const trace = linearTrace(traceId(3));
      return { ...trace, task: { ...trace.task, ...extra } } as TraceRecord;
    };
    const cyclic: Record<string, unknown> = {};
    cyclic["self"] = cyclic;
    const bad = linearTrace(traceId(2)) as unknown as Record<string, unknown>;
    bad["reward"] = 1; // derived views are never stored
    const attempts: Array<Promise<unknown>> = [
      writeStepRecords(dir, 1, [
        { kind: "train", env: "ok", traces: [linearTrace(traceId(1))] },
        { kind: "train", env: "bad", traces: [bad as unknown as TraceRecord] },
      ]),
      writeStepRecords(dir, 1, [{ kind: "train", env: "../escape", traces: [] }]),
      writeStepRecords(dir, 1, [{ kind: "train", env: "e".repeat(201), traces: [] }]), // over the 200-character limit
      writeStepRecords(dir, 1, [
        { kind: "train", env: "x", traces: [] },
        { kind: "train", env: "x", traces: [] },
      ]),
      writeRolloutRecords(dir, -1, { kind: "train", env: "x", traces: [] }),
      writeRolloutRecords(dir, 1, { kind: "train", env: "x", traces: [linearTrace(traceId(1))], policyVersion: -2 }),
      // The task's open-ended fields pass the schema but JSON cannot encode them.
      writeStepRecords(dir, 1, [{ kind: "train", env: "bigint", traces: [withTask({ seed: 1n })] }]),
      writeStepRecords(dir, 1, [{ kind: "train", env: "ok", traces: [linearTrace(traceId(1))] }, { kind: "train", env: "cycle", traces: [withTask(cyclic)] }]),
      encodeRecords([withTask({ seed: 1n })]),
    ];
    // Settled into values at once: a refusal must not sit unhandled while an earlier one is awaited.
    const outcomes = attempts.map((attempt) => attempt.then(() => null, (e: unknown) => e));
    for (const outcome of outcomes) {
      const error = await outcome;
      expect(error).toBeInstanceOf(ReplayError);
      expect((error as ReplayError).code).toBe("invalid_request");
    }
    expect(await readdir(dir)).toEqual([]);
  });

  // Each reward is a finite number, but their sum can overflow: JSON writes Infinity as null, and
  // every reader then ignored the file's index (its row schema wants a number) on every load.
  it("refuses a record whose rewards sum past the largest number, invalid_request, instead of writing an index no reader accepts", async () => {
    const overflowing = linearTrace(traceId(2));
    overflowing.rewards = { a: 1.7e308, b: 1.7e308 };
    const error = await writeStepRecords(dir, 1, [{ kind: "train", env: "g", traces: [linearTrace(traceId(1)), overflowing] }]).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ReplayError);
    expect((error as ReplayError).code).toBe("invalid_request");
    expect((error as ReplayError).message).toMatch(/record 1 of g: its rewards sum to Infinity/);
    expect(await readdir(dir)).toEqual([]);
  });

  it("of two concurrent writes of one step file with different content, exactly one lands and the other is refused", async () => {
    const ids = async (file: string) =>
      (await readFile(file, "utf8")).split("\n").filter(Boolean).map((line) => (JSON.parse(line) as { id: string }).id);
    const a = writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1))] });
    const b = writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(2)), linearTrace(traceId(3))] });
    const settled = await Promise.allSettled([a, b]);
    expect(settled.filter((r) => r.status === "fulfilled")).toHaveLength(1);
    expect(settled.find((r) => r.status === "rejected")).toMatchObject({ reason: { code: "invalid_request" } });
    const winner = settled[0]!.status === "fulfilled" ? [traceId(1)] : [traceId(2), traceId(3)];
    expect(await ids(path.join(dir, "step_1", "train_rollouts_gsm8k.jsonl"))).toEqual(winner);
    // The same bytes written concurrently are one write and its retry: both succeed.
    const same = () => writeRolloutRecords(dir, 2, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(4))] });
    await expect(Promise.all([same(), same()])).resolves.toHaveLength(2);
    expect((await readdir(path.join(dir, "step_2"))).filter((n) => n.startsWith("."))).toEqual([]); // no temp file left
  });

  it("a step marker two calls merge at once lists both calls' files (read again after each write)", async () => {
    // Interleaving: call A has read the (absent) marker and listed the step directory when call B
    // publishes its file and writes its marker; A then writes the list it computed before.
    const stepDir = path.join(dir, "step_1");
    const realReaddir = fs.promises.readdir.bind(fs.promises);
    let listings = 0;
    let other: Promise<unknown> | undefined;
    vi.spyOn(fs.promises, "readdir").mockImplementation((async (target: fs.PathLike, options?: unknown) => {
      const result = await realReaddir(target as string, options as never);
      // A's first listing is the one before its markers; its second is inside the first marker round.
      if (String(target) === stepDir && other === undefined && ++listings === 2) {
        other = writeStepRecords(dir, 1, [{ kind: "train", env: "b", traces: [linearTrace(traceId(2))] }]);
        await other;
      }
      return result;
    }) as never);
    await writeStepRecords(dir, 1, [{ kind: "train", env: "a", traces: [linearTrace(traceId(1))] }]);
    vi.restoreAllMocks();
    expect(other).toBeDefined();
    const listed = (JSON.parse(await readFile(path.join(stepDir, "_complete_train.json"), "utf8")) as { files: string[] }).files;
    expect(listed).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
  });

  it("a step marker that keeps losing files to concurrent writers is refused invalid_request (a ReplayError), and a retry completes it", async () => {
    // Every listing of the step directory finds one more file another writer just published, so no
    // marker this call writes ever lists them all.
    const stepDir = path.join(dir, "step_1");
    const realReaddir = fs.promises.readdir.bind(fs.promises);
    let ghosts = 0;
    vi.spyOn(fs.promises, "readdir").mockImplementation((async (target: fs.PathLike, options?: unknown) => {
      const result = (await realReaddir(target as string, options as never)) as unknown as string[];
      return String(target) === stepDir ? [...result, `train_rollouts_ghost${ghosts++}.jsonl`] : result;
    }) as never);
    const batch = [{ kind: "train" as const, env: "a", traces: [linearTrace(traceId(1))] }];
    let refusal: unknown;
    try {
      await writeStepRecords(dir, 1, batch);
    } catch (error) {
      refusal = error;
    } finally {
      vi.restoreAllMocks();
    }
    expect(refusal).toBeInstanceOf(ReplayError);
    expect(refusal).toMatchObject({ code: "invalid_request", message: expect.stringMatching(/kept losing files to concurrent writers/) });
    await writeStepRecords(dir, 1, batch);
    const listed = (JSON.parse(await readFile(path.join(stepDir, "_complete_train.json"), "utf8")) as { files: string[] }).files;
    expect(listed).toContain("train_rollouts_a.jsonl"); // with the ghosts it merged: they stand for other writers' files
  });

  it("refuses a record whose info.snapshots readers refuse, instead of writing a file that fails every later reload", async () => {
    const poisoned = compactedTrace(traceId(1), 0);
    poisoned.info = { snapshots: { "99": "snap-1" } }; // node 99 does not exist
    await expect(writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [poisoned] })).rejects.toMatchObject({ code: "invalid_request" });
    expect(await readdir(dir)).toEqual([]);
    await writeRolloutRecords(dir, 2, { kind: "train", env: "gsm8k", traces: [compactedTrace(traceId(2), 0)] });
    const replay = new ReplayTaskSource({ records: path.join(dir, "step_*/train_rollouts_gsm8k.jsonl"), source: { id: "gsm8k" } }, mathSource(), { logger: silent });
    await replay.load();
    expect(replay.size).toBe(1);
  });

  it("refuses a record whose line is longer than any reader can decode, though JSON encodes it", { timeout: 60_000 }, async () => {
    // Two UTF-8 bytes per character: the string fits a JS string, its line's bytes do not, and no
    // reader could ever load the file (every reload of the source would fail on it).
    const huge = linearTrace(traceId(1));
    huge.nodes[2]!.message.content = "é".repeat((constants.MAX_STRING_LENGTH >> 1) + 1024);
    await expect(writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [huge] })).rejects.toMatchObject({
      code: "invalid_request",
      message: expect.stringMatching(/record 0 .*longer than any reader can decode/),
    });
    expect(await readdir(dir)).toEqual([]);
  });

  // At the real limit (one Buffer, 4 GiB on Node 20) a batch's record file or index threw a bare
  // RangeError from Buffer.concat / Buffer.allocUnsafe, with no catalog code. Injected small here.
  it("refuses a batch whose record file or index would pass one buffer's limit, invalid_request, before publishing any file", async () => {
    // Records smaller than their index rows, so the index can pass the limit while the records fit.
    const bare = (n: number): TraceRecord => ({ id: traceId(n), task: { idx: n, name: null, prompt: null }, nodes: [], rewards: {} });
    const traces = [1, 2, 3].map(bare);
    const { recordBytes, indexBytes } = encodeRolloutRecords({ kind: "train", env: "big", step: 1, records: traces });
    const small = { kind: "train" as const, env: "small", traces: [bare(9)] };
    const big = { kind: "train" as const, env: "big", traces };
    for (const [limit, what] of [[recordBytes.length - 1, "record file"], [indexBytes.length - 1, "index"]] as const) {
      if (what === "index") expect(recordBytes.length).toBeLessThanOrEqual(limit);
      const refused = { code: "invalid_request", message: expect.stringMatching(new RegExp(`^the ${what} of a batch of 3 records would be \\d+ bytes, over the ${limit} one buffer can hold: split the batch`)) };
      await expect(writeStepRecords(dir, 1, [big, small], undefined, limit)).rejects.toMatchObject(refused);
      await expect(writeRolloutRecords(dir, 1, big, limit)).rejects.toMatchObject(refused);
      // No record file, no index, no marker: not even the env that fits.
      expect(await readdir(dir)).toEqual([]);
    }
    // Within the limit (here, the writer's default) the same call goes ahead.
    await writeStepRecords(dir, 1, [small, big]);
    expect((await readdir(path.join(dir, "step_1"))).sort()).toEqual(["_complete_train.json", "index_train_big.jsonl", "index_train_small.jsonl", "train_rollouts_big.jsonl", "train_rollouts_small.jsonl"]);
    expect(await readFile(path.join(dir, "step_1", "train_rollouts_big.jsonl"))).toEqual(recordBytes);
  });

  it("keeps writing off the caller's path and publishes steps in enqueue order", async () => {
    const writer = new RecordWriter(dir);
    const buffer = [linearTrace(traceId(1))];
    writer.enqueue(1, [{ kind: "train", env: "gsm8k", traces: buffer }]);
    buffer.length = 0; // the caller reuses its buffer at once
    writer.enqueue(2, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(2))] }]);
    await writer.flush();
    expect((await readFile(path.join(dir, "step_1", "train_rollouts_gsm8k.jsonl"), "utf8")).split("\n").filter(Boolean)).toHaveLength(1);
    const one = await stat(path.join(dir, "step_1", "_complete_train.json"));
    const two = await stat(path.join(dir, "step_2", "train_rollouts_gsm8k.jsonl"));
    expect(one.mtimeMs).toBeLessThanOrEqual(two.mtimeMs);
    writer.enqueue(3, [{ kind: "train", env: "no/slash", traces: [] }]);
    writer.enqueue(4, [{ kind: "train", env: "gsm8k", traces: [] }]);
    await expect(writer.flush()).rejects.toMatchObject({ code: "invalid_request" });
    expect((await readdir(dir)).sort()).toEqual(["step_1", "step_2"]); // step 4 never overtakes failed step 3
  });

  it("refuses a step that does not follow the last one enqueued, writing nothing for it", async () => {
    const writer = new RecordWriter(dir);
    writer.enqueue(2, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(2))] }]);
    for (const step of [2, 1]) {
      expect(() => writer.enqueue(step, [{ kind: "train", env: "late", traces: [linearTrace(traceId(9))] }])).toThrow(
        expect.objectContaining({ code: "invalid_request" }),
      );
    }
    writer.enqueue(3, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(3))] }]);
    await writer.flush(); // the refusals failed nothing queued
    expect((await readdir(dir)).sort()).toEqual(["step_2", "step_3"]);
    expect((await readdir(path.join(dir, "step_2"))).filter((name) => name.includes("late"))).toEqual([]);
  });
});
