import { mkdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import * as reader from "../../../participants/replay/record-reader.js";
import { ReplayTaskSource, writeRolloutRecords, type ReplayConfigInput, type ReplayTask, type TraceRecord } from "../../../participants/replay/index.js";
import { linearTrace, mathSource, silent, tempDir, traceId, type MathTask } from "./fixtures.js";

// Counts every record file the task source opens (readRecords is its only way to read one).
const opened = vi.hoisted(() => [] as string[]);
vi.mock("../../../participants/replay/record-reader.js", async (importOriginal) => {
  const actual = await importOriginal<typeof reader>();
  return {
    ...actual,
    readRecords: (file: string, options: reader.ReadOptions) => {
      opened.push(path.basename(path.dirname(file)));
      return actual.readRecords(file, options);
    },
  };
});

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => {
  ({ dir, cleanup } = await tempDir());
  opened.length = 0;
});
afterEach(() => cleanup());

const rollouts = () => path.join(dir, "run", "rollouts");
const recordFile = (step: number) => path.join(rollouts(), `step_${step}`, "train_rollouts_gsm8k.jsonl");
const write = (step: number, traces: TraceRecord[]) => writeRolloutRecords(rollouts(), step, { kind: "train", env: "gsm8k", traces });
const source = (options: { maxRetainedBytes?: number } = {}, config: Partial<ReplayConfigInput> = {}) =>
  new ReplayTaskSource<MathTask, string, number>(
    { records: "run/rollouts/step_*/train_rollouts_gsm8k.jsonl", source: { id: "gsm8k" }, mode: "recheck", ...config },
    mathSource(),
    { cwd: dir, logger: silent, ...options },
  );
const reads = () => opened.splice(0);
const fails = (replay: ReplayTaskSource<MathTask, string, number>) => expect(replay.reload()).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
async function corrupt(step: number): Promise<void> {
  await mkdir(path.dirname(recordFile(step)), { recursive: true });
  await writeFile(recordFile(step), "{oops\n");
}
async function repair(step: number, traces: TraceRecord[]): Promise<void> {
  await rm(path.dirname(recordFile(step)), { recursive: true });
  await write(step, traces);
}
/** What a worker that never saw the failures loads from the same files. */
async function fresh(): Promise<readonly ReplayTask<MathTask>[]> {
  const replay = source();
  await replay.load();
  return replay.tasks;
}

/**
 * docs/replay.md (Follow mode): a reload stays all-or-nothing, but the files a failed reload parsed
 * are not read again while they are unchanged. Every poll behind one corrupt file late in a run
 * re-read and re-parsed every good file before it, and kept none of them.
 */
describe("a failed reload keeps what it parsed", () => {
  it("the next poll reads only the file that failed, and serves nothing until it succeeds", async () => {
    for (const step of [1, 2, 3]) await write(step, [linearTrace(traceId(2 * step), 0), linearTrace(traceId(2 * step + 1), 0)]);
    await corrupt(4);
    const replay = source();
    await fails(replay);
    expect(reads()).toEqual(["step_1", "step_2", "step_3", "step_4"]);
    expect(replay.size).toBe(0);
    for (let poll = 0; poll < 3; poll++) {
      await fails(replay);
      expect(reads()).toEqual(["step_4"]); // it was ["step_1", "step_2", "step_3", "step_4"] at every poll
      expect(replay.size).toBe(0); // still all-or-nothing
    }
    await repair(4, [linearTrace(traceId(8), 0)]);
    expect(await replay.reload()).toMatchObject({ added: 7, total: 7 });
    expect(reads()).toEqual(["step_4"]);
    expect(replay.tasks).toEqual(await fresh());
    expect(replay.stats.read.records).toBe(7); // each loaded file counted once
    expect((await replay.reload()).added).toBe(0);
  });

  it("a good file that changed since is read again (its size, mtime or inode differ)", async () => {
    await write(1, [linearTrace(traceId(1), 0)]);
    await write(2, [linearTrace(traceId(2), 0)]);
    await corrupt(3);
    const replay = source();
    await fails(replay);
    reads();
    await repair(2, [linearTrace(traceId(20), 0), linearTrace(traceId(21), 0)]);
    await fails(replay);
    expect(reads()).toEqual(["step_2", "step_3"]);
    await repair(3, [linearTrace(traceId(3), 0)]);
    await replay.reload();
    expect(reads()).toEqual(["step_3"]);
    expect(replay.tasks.map((t) => t.name)).toEqual(["recheck:00000001", "recheck:00000014", "recheck:00000015", "recheck:00000003"]);
    expect(replay.tasks).toEqual(await fresh());
  });

  it("a file that appears before the kept ones shifts their indices, as a full read would", async () => {
    await write(2, [linearTrace(traceId(2), 0)]);
    await write(3, [linearTrace(traceId(3), 0)]);
    await corrupt(4);
    const replay = source();
    await fails(replay);
    reads();
    await write(1, [linearTrace(traceId(1), 0), linearTrace(traceId(11), 0)]);
    await repair(4, [linearTrace(traceId(4), 0)]);
    await replay.reload();
    expect(reads()).toEqual(["step_1", "step_4"]);
    expect(replay.tasks.map((t) => [t.idx, t.task.idx])).toEqual([0, 1, 2, 3, 4].map((i) => [i, i]));
    expect(replay.tasks).toEqual(await fresh());
  });

  it("keeps files only up to maxRetainedBytes of parsed records: the rest are read again", async () => {
    for (const step of [1, 2, 3]) await write(step, [linearTrace(traceId(step), 0)]);
    await corrupt(4);
    const probe = source();
    await fails(probe);
    reads();
    // One record line is a few hundred bytes: room for the first file only.
    const line = (JSON.stringify(linearTrace(traceId(1), 0)) + "\n").length;
    const replay = source({ maxRetainedBytes: line + 10 });
    await fails(replay);
    reads();
    await fails(replay);
    expect(reads()).toEqual(["step_2", "step_3", "step_4"]);
    const none = source({ maxRetainedBytes: 0 });
    await fails(none);
    reads();
    await fails(none);
    expect(reads()).toEqual(["step_1", "step_2", "step_3", "step_4"]);
  });

  it("with wait_for_step_marker the kept files are reused the same way", async () => {
    // writeRolloutRecords writes no marker: a marker-less step waits. A hand marker completes each.
    const marker = (step: number) =>
      writeFile(path.join(rollouts(), `step_${step}`, "_complete_train.json"), JSON.stringify({ format: "gym-ckpt/rollout-step", version: 1, step, kind: "train", files: ["train_rollouts_gsm8k.jsonl"] }));
    for (const step of [1, 2]) {
      await write(step, [linearTrace(traceId(step), 0)]);
      await marker(step);
    }
    await corrupt(3);
    await marker(3);
    const replay = source({}, { wait_for_step_marker: true });
    await fails(replay);
    expect(reads()).toEqual(["step_1", "step_2", "step_3"]);
    await fails(replay);
    expect(reads()).toEqual(["step_3"]);
  });
});
