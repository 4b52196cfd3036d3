import { execFileSync } from "node:child_process";
import { promises as fsPromises, rmSync } from "node:fs";
import { copyFile, mkdir, readFile, rename, rm, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { pino } from "pino";
import { waitUntil } from "../../support/wait-until.js";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  ReplayError,
  ReplayTaskSource,
  writeFileAtomic,
  writeRolloutRecords,
  writeStepRecords,
  type ReplayConfigInput,
  type ReplayTask,
  type TraceRecord,
} from "../../../participants/replay/index.js";
import {
  call,
  collect,
  compactedTrace,
  linearTrace,
  mathSource,
  MathTaskSchema,
  result,
  RESTART,
  say,
  silent,
  sys,
  TASK_PROMPT,
  tempDir,
  TraceBuilder,
  traceId,
  user,
  type MathTask,
} from "./fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

const rollouts = () => path.join(dir, "run", "rollouts");

function source(config: Partial<ReplayConfigInput> = {}, env = mathSource()) {
  return new ReplayTaskSource<MathTask, string, number>(
    { records: "run/rollouts/step_*/train_rollouts_gsm8k.jsonl", source: { id: "gsm8k" }, mode: "recheck", ...config },
    env,
    { cwd: dir, logger: silent },
  );
}

const write = (step: number, traces: TraceRecord[], env = "gsm8k") => writeRolloutRecords(rollouts(), step, { kind: "train", env, traces });
const names = (tasks: readonly ReplayTask[]) => tasks.map((t) => t.name);
const withoutFile = (tasks: readonly ReplayTask[]) => tasks.map((t) => ({ ...t, lineage: { ...t.lineage, sourceFile: path.basename(t.lineage.sourceFile) } }));

describe("delegation (17)", () => {
  it("reports the source's capabilities and loads the source's typed tasks", async () => {
    const plain = source();
    expect([plain.definesTools, plain.definesUser, plain.definesGroupRewards(), plain.stops, plain.stateType, plain.needsContainer]).toEqual([false, false, false, [], undefined, false]);

    const tools = [{ name: "python" }];
    const userSim = { persona: "student" };
    const rich = source({}, mathSource({ tools, user: userSim, stops: ["answer_given"], stateType: "dialog", definesGroupRewards: () => true }));
    expect(rich.definesTools).toBe(true);
    expect(rich.tools).toBe(tools);
    expect(rich.definesUser).toBe(true);
    expect(rich.user).toBe(userSim);
    expect(rich.definesGroupRewards()).toBe(true);
    expect(rich.stops).toEqual(["answer_given"]);
    expect(rich.stateType).toBe("dialog");
    expect(source({}, mathSource({ needsContainer: true })).needsContainer).toBe(true);

    const record = linearTrace(traceId(0xabc), 0);
    record.task = { idx: 17, name: "gsm8k", prompt: TASK_PROMPT, answer: "42" };
    await write(1, [record]);
    await rich.load();
    expect(rich.tasks).toHaveLength(1);
    const [task] = rich.tasks;
    expect(task!.task).toEqual({ idx: 0, name: "recheck:00000abc", prompt: task!.prompt, answer: "42" });
    expect(task!.idx).toBe(0);
  });

  it("delegates scoring to the source verifier on the source-typed task", async () => {
    const score = vi.fn((t: MathTask, rollout: string) => (rollout.includes(t.answer) ? 1 : 0));
    const replay = source({}, mathSource({ score }));
    await write(1, [linearTrace(traceId(1), 0)]);
    await replay.load();
    const task = replay.tasks[0]!;
    expect(await replay.score(task, "so 42")).toBe(1);
    expect(await replay.score(task, "so 41")).toBe(0);
    expect(score).toHaveBeenCalledWith(task.task, "so 42");
    expect(await replay.scoreGroup([task, task], ["42", "x"])).toEqual([1, 0]);
  });

  it("delegates finalize and validate to the source on the source-typed task, with defaults when it has none", async () => {
    await write(1, [linearTrace(traceId(1), 0)]);
    const finalize = vi.fn();
    const validate = vi.fn((t: MathTask, rollout: string) => rollout.includes(t.answer));
    const replay = source({}, mathSource({ finalize, validate }));
    await replay.load();
    const task = replay.tasks[0]!;
    await replay.finalize(task, "so 42");
    expect(finalize).toHaveBeenCalledWith(task.task, "so 42");
    expect(await replay.validate(task, "so 42")).toBe(true);
    expect(await replay.validate(task, "no answer")).toBe(false);
    expect(validate).toHaveBeenCalledWith(task.task, "so 42");
    const plain = source();
    await plain.load();
    await plain.finalize(plain.tasks[0]!, "x");
    expect(await plain.validate(plain.tasks[0]!, "x")).toBe(true);
  });

  it("restores an anchor snapshot after the source's setup, and refuses when the source cannot", async () => {
    const traced = compactedTrace(traceId(5), 0);
    traced.info = { snapshots: { "9": "snap-final" } };
    await write(1, [traced]);
    const calls: string[] = [];
    const capable = source({}, mathSource({ setup: () => void calls.push("setup"), restoreSnapshot: (_t, ref) => void calls.push(`restore ${ref}`) }));
    await capable.load();
    expect(capable.tasks[0]!.snapshot).toBe("snap-final");
    await capable.setup(capable.tasks[0]!);
    expect(calls).toEqual(["setup", "restore snap-final"]);
    const unable = source();
    await unable.load();
    await expect(unable.setup(unable.tasks[0]!)).rejects.toMatchObject({ code: "invalid_request" });
  });
});

describe("follow and append (18)", () => {
  it("starts empty, loads step_9 before step_10, appends on reload and never re-mines replays", async () => {
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (s: string) => void lines.push(s) });
    const replay = new ReplayTaskSource<MathTask, string, number>(
      { records: "run/rollouts/step_*/train_rollouts_gsm8k.jsonl", source: { id: "gsm8k" }, mode: "recheck" },
      mathSource(),
      { cwd: dir, logger },
    );
    expect(await replay.load()).toEqual({ added: 0, total: 0, files: [] });
    expect(lines.join("")).toMatch(/matched no files/);

    await write(10, [linearTrace(traceId(0x10), 0)]);
    await write(9, [linearTrace(traceId(0x9), 0), linearTrace(traceId(0x99), 0)]);
    await replay.reload();
    expect(names(replay.tasks)).toEqual(["recheck:00000009", "recheck:00000099", "recheck:00000010"]);
    expect(replay.tasks.map((t) => t.lineage.sourceStep)).toEqual([9, 9, 10]);
    const before = [...replay.tasks];

    await write(11, [linearTrace(traceId(0x11), 0)]);
    const grown = await replay.reload();
    expect(grown.added).toBe(1);
    expect(replay.tasks.map((t) => t.idx)).toEqual([0, 1, 2, 3]);
    before.forEach((task, i) => expect(replay.tasks[i]).toBe(task)); // same objects, same indices

    const replayed = linearTrace(traceId(0x12), 0, "recheck:00000009");
    const lineaged = linearTrace(traceId(0x13), 0);
    lineaged.info = { replay: { sourceTraceId: traceId(0x9) } };
    await write(12, [replayed, lineaged]);
    expect((await replay.reload()).added).toBe(0);
    expect(replay.stats.read.skipped.replayed).toBe(2);
    expect(replay.size).toBe(4);
  });

  it("does not re-read a file already loaded, even when it changes or its index appears", async () => {
    const { recordPath, indexPath } = await write(1, [linearTrace(traceId(1), 0), linearTrace(traceId(2), 0)]);
    await rename(indexPath, indexPath + ".hidden"); // record visible before its index
    const early = source();
    await early.load();
    expect([early.stats.read.filesFullParsed, early.stats.read.filesIndexed]).toEqual([1, 0]);
    await rename(indexPath + ".hidden", indexPath);
    expect((await early.reload()).added).toBe(0);
    expect(early.stats.read.files).toBe(1);

    const late = source(); // another worker loading after the index landed
    await late.load();
    expect(late.stats.read.filesIndexed).toBe(1);
    expect(late.tasks).toEqual(early.tasks);
    expect(recordPath).toBe(late.tasks[0]!.lineage.sourceFile);
  });

  it("does not load a file again when a link to it appears later, even one that sorts first", async () => {
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl" };
    const { recordPath } = await write(1, [linearTrace(traceId(1), 0)], "b");
    const follower = source(config);
    await follower.load();
    await symlink(path.basename(recordPath), path.join(path.dirname(recordPath), "train_rollouts_a.jsonl"));
    expect((await follower.reload()).added).toBe(0);
    const cold = source(config);
    await cold.load();
    expect(names(follower.tasks)).toEqual(["recheck:00000001"]);
    expect(names(cold.tasks)).toEqual(names(follower.tasks));
  });

  it("a poll stats and resolves only what may be new: one new file after 500 loaded costs O(1) stat/realpath calls, not 501", { timeout: 20_000 }, async () => {
    const line = JSON.stringify(linearTrace(traceId(1), 0)) + "\n";
    const put = async (step: number, env: string) => {
      await mkdir(path.join(rollouts(), `step_${step}`), { recursive: true });
      await writeFile(path.join(rollouts(), `step_${step}`, `train_rollouts_${env}.jsonl`), line);
    };
    for (let step = 1; step <= 100; step++) for (const env of ["a", "b", "c", "d", "e"]) await put(step, env);
    const follower = source({ records: "run/rollouts/step_*/train_rollouts_*.jsonl" });
    expect((await follower.load()).files).toHaveLength(500);
    await put(101, "a");
    const spies = (["stat", "lstat", "realpath", "readdir"] as const).map((name) => vi.spyOn(fsPromises, name));
    try {
      expect((await follower.reload()).files).toHaveLength(1);
      const [stat, lstat, realpath, readdir] = spies.map((spy) => spy.mock.calls.length);
      // Per file: nothing (a listed regular file is neither stat'ed nor resolved). Per directory:
      // one listing (the only way to see a new entry without trusting mtimes), and one resolution
      // of the directory the pattern names literally.
      expect({ stat, lstat, realpath }).toEqual({ stat: 0, lstat: 0, realpath: 1 });
      expect(readdir).toBe(1 + 101);
    } finally {
      for (const spy of spies) spy.mockRestore();
    }
  });

  it("a file the glob names literally below a wildcard (step_*/<file>) costs one lstat per poll, not a stat and a resolution", { timeout: 20_000 }, async () => {
    const line = JSON.stringify(linearTrace(traceId(1), 0)) + "\n";
    const put = async (step: number) => {
      await mkdir(path.join(rollouts(), `step_${step}`), { recursive: true });
      await writeFile(path.join(rollouts(), `step_${step}`, "train_rollouts_a.jsonl"), line);
    };
    for (let step = 1; step <= 100; step++) await put(step);
    const follower = source({ records: "run/rollouts/step_*/train_rollouts_a.jsonl" });
    expect((await follower.load()).files).toHaveLength(100);
    await put(101);
    const spies = (["stat", "lstat", "realpath", "readdir"] as const).map((name) => vi.spyOn(fsPromises, name));
    try {
      expect((await follower.reload()).files).toHaveLength(1);
      const [stat, lstat, realpath, readdir] = spies.map((spy) => spy.mock.calls.length);
      // One listing of step_*, one lstat per step directory's file, one resolution of the directory
      // the pattern names literally. Before: a stat and a realpath per file (101 + 102).
      expect({ stat, lstat, realpath, readdir }).toEqual({ stat: 0, lstat: 101, realpath: 1, readdir: 1 });
    } finally {
      for (const spy of spies) spy.mockRestore();
    }
  });

  it("follows a literally named link to a directory when it is retargeted (latest -> step_N)", async () => {
    const config = { records: "run/rollouts/latest/train_rollouts_*.jsonl" };
    await write(1, [linearTrace(traceId(1), 0)]);
    await write(2, [linearTrace(traceId(2), 0)]);
    await symlink("step_1", path.join(rollouts(), "latest"));
    const follower = source(config);
    await follower.load();
    expect(names(follower.tasks)).toEqual(["recheck:00000001"]);
    await symlink("step_2", path.join(rollouts(), "latest.new"));
    await rename(path.join(rollouts(), "latest.new"), path.join(rollouts(), "latest"));
    await follower.reload();
    expect(names(follower.tasks)).toEqual(["recheck:00000001", "recheck:00000002"]);
    await symlink("step_1", path.join(rollouts(), "latest.new"));
    await rename(path.join(rollouts(), "latest.new"), path.join(rollouts(), "latest"));
    expect((await follower.reload()).added).toBe(0); // step_1's file, by its real path, is loaded already
  });

  it("loads the new target of a linked record file that is retargeted, and never an old one again", async () => {
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl" };
    const { recordPath: one } = await write(1, [linearTrace(traceId(1), 0)], "x");
    await mkdir(path.join(rollouts(), "other"), { recursive: true });
    const two = path.join(rollouts(), "other", "train_rollouts_x.jsonl");
    await copyFile(one, two);
    await writeFile(two, JSON.stringify(linearTrace(traceId(2), 0)) + "\n");
    const link = path.join(rollouts(), "step_2", "train_rollouts_y.jsonl");
    await mkdir(path.dirname(link));
    await symlink(one, link);
    const follower = source(config);
    await follower.load();
    expect(names(follower.tasks)).toEqual(["recheck:00000001"]);
    await symlink(two, link + ".new");
    await rename(link + ".new", link);
    await follower.reload();
    expect(names(follower.tasks)).toEqual(["recheck:00000001", "recheck:00000002"]);
  });

  it("never treats index files or step markers as records, even under a broad glob", async () => {
    await writeStepRecords(rollouts(), 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] }]);
    const broad = source({ records: "run/rollouts/**/*" });
    await broad.load();
    expect(names(broad.tasks)).toEqual(["recheck:00000001"]);
    expect(broad.stats.read.files).toBe(1);
    // Nor does a follower waiting for markers wait on them (they sort before the record file).
    await writeStepRecords(rollouts(), 2, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(2), 0)] }]);
    const waiting = source({ records: "run/rollouts/**/*", wait_for_step_marker: true });
    await waiting.load();
    expect(names(waiting.tasks)).toEqual(["recheck:00000001", "recheck:00000002"]);
  });

  it("appends files in the order they appear: a step's envs written out of order misalign a follower", async () => {
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl" };
    const follower = source(config);
    await write(1, [linearTrace(traceId(0xb), 0)], "b");
    await follower.reload();
    await write(1, [linearTrace(traceId(0xa), 0)], "a");
    await follower.reload();
    const cold = source(config);
    await cold.load();
    expect(names(follower.tasks)).toEqual(["recheck:0000000b", "recheck:0000000a"]);
    expect(names(cold.tasks)).toEqual(["recheck:0000000a", "recheck:0000000b"]);
  });

  it("with wait_for_step_marker, consumes a step only when complete and never out of order", async () => {
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl", wait_for_step_marker: true };
    const follower = source(config);
    await write(1, [linearTrace(traceId(0xb), 0)], "b");
    expect((await follower.reload()).added).toBe(0);
    await write(1, [linearTrace(traceId(0xa), 0)], "a");
    await writeStepRecords(rollouts(), 2, [{ kind: "train", env: "a", traces: [linearTrace(traceId(0x2a), 0)] }]);
    expect((await follower.reload()).added).toBe(0); // step 2 is complete but waits behind step 1
    const marker = { format: "gym-ckpt/rollout-step", version: 1, step: 1, kind: "train", files: ["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"] };
    await writeFileAtomic(path.join(rollouts(), "step_1", "_complete_train.json"), Buffer.from(JSON.stringify(marker)));
    await follower.reload();
    const cold = source(config);
    await cold.load();
    expect(names(follower.tasks)).toEqual(["recheck:0000000a", "recheck:0000000b", "recheck:0000002a"]);
    expect(follower.tasks).toEqual(cold.tasks);
  });

  it("with wait_for_step_marker, a marker completes only its own step's files of its own kind", async () => {
    const config = { records: "run/rollouts/step_*/*_rollouts_*.jsonl", wait_for_step_marker: true };
    const marker = (file: string, body: object) => writeFileAtomic(path.join(rollouts(), "step_2", file), Buffer.from(JSON.stringify({ format: "gym-ckpt/rollout-step", version: 1, ...body })));
    await writeStepRecords(rollouts(), 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] }]);
    await write(2, [linearTrace(traceId(2), 0)]);
    await writeRolloutRecords(rollouts(), 2, { kind: "eval", env: "gsm8k", traces: [linearTrace(traceId(0xe), 0)] });
    // Step 1's marker copied into step 2 names the same file, written by a writer of another step.
    await marker("_complete_train.json", { step: 1, kind: "train", files: ["train_rollouts_gsm8k.jsonl"] });
    // A marker under train's name written for eval, and a train marker that lists an eval file.
    await marker("_complete_eval.json", { step: 2, kind: "train", files: ["train_rollouts_gsm8k.jsonl", "eval_rollouts_gsm8k.jsonl"] });
    const follower = source(config);
    await follower.load();
    expect(names(follower.tasks)).toEqual(["recheck:00000001"]);
    await marker("_complete_train.json", { step: 2, kind: "train", files: ["train_rollouts_gsm8k.jsonl", "eval_rollouts_gsm8k.jsonl"] });
    await follower.reload();
    expect(names(follower.tasks)).toEqual(["recheck:00000001"]); // the eval file sorts first and still waits
    await marker("_complete_eval.json", { step: 2, kind: "eval", files: ["eval_rollouts_gsm8k.jsonl"] });
    await follower.reload();
    expect(names(follower.tasks)).toEqual(["recheck:00000001", "recheck:0000000e", "recheck:00000002"]);
  });

  it("with wait_for_step_marker, takes a FIFO marker for an absent one instead of blocking every later call", { timeout: 5000 }, async () => {
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl", wait_for_step_marker: true };
    const follower = source(config);
    await write(1, [linearTrace(traceId(1), 0)]);
    const marker = path.join(rollouts(), "step_1", "_complete_train.json");
    execFileSync("mkfifo", [marker]);
    expect((await follower.reload()).added).toBe(0);
    expect(await follower.next()).toBeUndefined(); // a reload is single-flight: a hung one would hang this too
    await rm(marker);
    await writeStepRecords(rollouts(), 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] }]);
    expect((await follower.next())?.name).toBe("recheck:00000001");
  });

  it("refuses a reload whose step directory the storage would not list (EMFILE), instead of consuming a later step before it", async () => {
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl", wait_for_step_marker: true };
    for (const step of [1, 2]) await writeStepRecords(rollouts(), step, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(step), 0)] }]);
    const follower = source(config);
    const step1 = path.join(rollouts(), "step_1");
    const real = fsPromises.readdir.bind(fsPromises);
    const readdir = vi.spyOn(fsPromises, "readdir").mockImplementation((async (dir: string, options: never) => {
      if (dir === step1) throw Object.assign(new Error(`EMFILE: too many open files, scandir '${dir}'`), { code: "EMFILE" });
      return real(dir, options);
    }) as never);
    try {
      await expect(follower.reload()).rejects.toMatchObject({ code: "EMFILE" });
      expect(follower.size).toBe(0);
    } finally {
      readdir.mockRestore();
    }
    await follower.reload();
    const cold = source(config);
    await cold.load();
    expect(names(follower.tasks)).toEqual(["recheck:00000001", "recheck:00000002"]);
    expect(follower.tasks).toEqual(cold.tasks);
  });

  it("with wait_for_step_marker, never consumes a marked step from a listing older than its marker", async () => {
    // The writer publishes a step's envs concurrently, then the marker: a follower that listed the
    // step while one env was still in flight, then read the marker listing it, must not take the rest.
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl", wait_for_step_marker: true };
    const env = (name: string) => ({ kind: "train" as const, env: name, traces: [linearTrace(traceId(name === "a" ? 0xa : name === "aa" ? 0xaa : 0xb), 0)] });
    await write(1, env("a").traces, "a");
    await write(1, env("b").traces, "b");
    const follower = source(config);
    const step1 = path.join(rollouts(), "step_1");
    const real = fsPromises.readdir.bind(fsPromises);
    let raced = false;
    const readdir = vi.spyOn(fsPromises, "readdir").mockImplementation((async (dir: string, options: never) => {
      const listed = await real(dir, options);
      if (dir === step1 && !raced) {
        raced = true; // the listing is taken; now the last env lands and the marker follows
        await writeStepRecords(rollouts(), 1, [env("a"), env("aa"), env("b")]);
      }
      return listed;
    }) as never);
    try {
      await follower.reload();
    } finally {
      readdir.mockRestore();
    }
    await follower.reload();
    const cold = source(config);
    await cold.load();
    expect(names(cold.tasks)).toEqual(["recheck:0000000a", "recheck:000000aa", "recheck:0000000b"]);
    expect(names(follower.tasks)).toEqual(names(cold.tasks));
  });

  it("with wait_for_step_marker, follows past a step whose write was interrupted once it is retried", async () => {
    const config = { records: "run/rollouts/step_*/train_rollouts_*.jsonl", wait_for_step_marker: true };
    const follower = source(config);
    const a = { kind: "train" as const, env: "a", traces: [linearTrace(traceId(0xa), 0)] };
    const b = { kind: "train" as const, env: "b", traces: [linearTrace(traceId(0xb), 0)] };
    await writeRolloutRecords(rollouts(), 1, a); // writeStepRecords(1, [a, b]) stopped here: no b, no marker
    expect((await follower.reload()).added).toBe(0);
    await writeStepRecords(rollouts(), 1, [a, b]);
    await writeStepRecords(rollouts(), 2, [{ kind: "train", env: "a", traces: [linearTrace(traceId(0x2a), 0)] }]);
    await follower.reload();
    expect(names(follower.tasks)).toEqual(["recheck:0000000a", "recheck:0000000b", "recheck:0000002a"]);
  });
});

describe("loading", () => {
  it("(19) index-selected and full-parse loading yield identical tasks", async () => {
    const traces = Array.from({ length: 12 }, (_, i) => (i % 2 ? compactedTrace(traceId(i), i % 3 ? 0 : 1) : linearTrace(traceId(i), i % 3 ? 0 : 1)));
    const { recordPath } = await write(1, traces);
    const plainDir = path.join(dir, "plain", "rollouts", "step_1");
    await mkdir(plainDir, { recursive: true });
    await copyFile(recordPath, path.join(plainDir, "train_rollouts_gsm8k.jsonl"));
    for (const config of [{ max_source_reward: 0.5 }, { mode: "continue" as const }, { mode: "continue" as const, anchor: "tool-call" as const, max_anchors: null }]) {
      const indexed = source(config);
      const plain = source({ ...config, records: "plain/rollouts/step_*/train_rollouts_gsm8k.jsonl" });
      await Promise.all([indexed.load(), plain.load()]);
      expect(indexed.size).toBeGreaterThan(0);
      expect(withoutFile(plain.tasks)).toEqual(withoutFile(indexed.tasks));
      expect([indexed.stats.read.filesIndexed, plain.stats.read.filesFullParsed]).toEqual([1, 1]);
    }
  });

  it("falls back to a full parse when the index disagrees with the bytes it selects", async () => {
    const { recordPath } = await write(1, [linearTrace(traceId(1), 0), linearTrace(traceId(2), 0)]);
    const data = await readFile(recordPath);
    data.write(traceId(3), data.indexOf(traceId(2)));
    await writeFile(recordPath, data);
    const replay = source();
    await replay.load();
    expect(names(replay.tasks)).toEqual(["recheck:00000001", "recheck:00000003"]);
    expect(replay.stats.indexFallbacks).toBe(1);
  });

  it("carries full lineage, drops overlong seeds and foreign records", async () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [call("a"), true], [result("a", "42")], [say("42"), true]]);
    const tool = b.trace(traceId(0x77));
    const foreign = linearTrace(traceId(0x88));
    foreign.task = { idx: 3, name: "mbpp", prompt: "Write a function." }; // no `answer`: not a gsm8k task
    await write(4, [tool, foreign, compactedTrace(traceId(0x99))]);
    const replay = source({ mode: "continue", anchor: "tool-call", max_anchors: null });
    await replay.load();
    expect(names(replay.tasks)).toEqual(["continue:00000077:tool-call3", "continue:00000099:tool-call3", "continue:00000099:tool-call3-1"]);
    expect(replay.tasks[0]!.lineage).toEqual({
      mode: "continue",
      anchor: "tool-call",
      sourceEnv: "gsm8k",
      sourceTraceId: traceId(0x77),
      sourceFile: path.join(rollouts(), "step_4", "train_rollouts_gsm8k.jsonl"),
      sourceStep: 4,
      sourceOrdinal: 0,
      sourceTaskIdx: 0,
      sourceTaskName: "gsm8k",
      anchorNode: 3,
    });
    expect(replay.stats.foreign).toBe(1);

    const budget = replay.tasks[1]!.seedTokens; // the shorter of the compacted trace's two seeds
    const tight = source({ mode: "continue", anchor: "tool-call", max_anchors: null, max_seed_tokens: budget });
    await tight.load();
    expect(tight.tasks.every((t) => t.seedTokens <= budget)).toBe(true);
    expect(tight.stats.overlong).toBe(replay.tasks.filter((t) => t.seedTokens > budget).length);
    expect(tight.stats.overlong).toBeGreaterThan(0);
  });

  it("compaction mode replays restarts as string prompts", async () => {
    await write(1, [linearTrace(traceId(1)), compactedTrace(traceId(2))]);
    const replay = source({ mode: "continue" });
    await replay.load();
    expect(replay.tasks.map((t) => [t.name, t.prompt, t.task.prompt])).toEqual([["continue:00000002:compaction0", RESTART, RESTART]]);
    expect(replay.stats.read.skipped.no_seed).toBe(1); // the linear record, by branch count
  });

  // Reference §7.1: every restart is seeded, named by the count of seeds so far; max_anchors (1 by
  // default) limits only tool-call anchors.
  it("compaction mode seeds every restart of a trace compacted twice, whatever max_anchors says", async () => {
    const b = new TraceBuilder();
    const root = b.add(null, sys());
    b.chain(root, [[user(TASK_PROMPT)], [call("c1"), true], [result("c1", "6")], [say("Handoff one."), true]]);
    b.chain(root, [[user("Summary one: 6 so far.")], [call("c2"), true], [result("c2", "42")], [say("Handoff two."), true]]);
    b.chain(root, [[user("Summary two: 42 computed.")], [say("Final answer: 42"), true]]);
    await write(1, [b.trace(traceId(3))]);
    for (const max_anchors of [1, null]) {
      const replay = source({ mode: "continue", anchor: "compaction", max_anchors });
      await replay.load();
      expect(replay.tasks.map((t) => [t.name, t.prompt])).toEqual([
        ["continue:00000003:compaction0", "Summary one: 6 so far."],
        ["continue:00000003:compaction1", "Summary two: 42 computed."],
      ]);
    }
  });

  it("parses in full past a FIFO index instead of blocking every later call", { timeout: 5000 }, async () => {
    const { indexPath } = await write(1, [linearTrace(traceId(1), 0)]);
    await rm(indexPath);
    execFileSync("mkfifo", [indexPath]);
    const replay = source();
    expect((await replay.next())?.name).toBe("recheck:00000001");
    expect([replay.stats.read.indexRejected, replay.stats.read.filesFullParsed]).toEqual([1, 1]);
  });

  it("refuses a FIFO named like a record file (invalid_checkpoint_state, at once) instead of loading on without it", { timeout: 5000 }, async () => {
    const { recordPath } = await write(1, [linearTrace(traceId(1), 0)]);
    const fifo = recordPath.replace(`${path.sep}step_1${path.sep}`, `${path.sep}step_2${path.sep}`);
    await mkdir(path.dirname(fifo), { recursive: true });
    execFileSync("mkfifo", [fifo]);
    await expect(source().load()).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });
  });

  it("skips a file that vanished between the glob and its open (retention), logging it, instead of failing the reload", async () => {
    await write(1, [linearTrace(traceId(1), 0)]);
    const { recordPath } = await write(2, [linearTrace(traceId(2), 0)]);
    await write(3, [linearTrace(traceId(3), 0)]);
    // Step 2 is removed while step 1 is being read: after the glob listed it, before its open.
    let removed = false;
    const taskSchema = mathSource().taskSchema.superRefine(() => {
      if (!removed) rmSync(recordPath);
      removed = true;
    });
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(line) });
    const replay = new ReplayTaskSource<MathTask, string, number>(
      { records: "run/rollouts/step_*/train_rollouts_gsm8k.jsonl", source: { id: "gsm8k" }, mode: "recheck" },
      mathSource({ taskSchema: taskSchema as unknown as typeof MathTaskSchema }),
      { cwd: dir, logger },
    );
    const loaded = await replay.load();
    expect(names(replay.tasks)).toEqual(["recheck:00000001", "recheck:00000003"]);
    expect(loaded.files.map((f) => path.basename(path.dirname(f)))).toEqual(["step_1", "step_2", "step_3"]);
    expect(lines.join("")).toMatch(/vanished/);
    expect((await replay.reload()).added).toBe(0);
  });

  it("refuses a corrupt file without changing state", async () => {
    await write(1, [linearTrace(traceId(1), 0)]);
    const bad = path.join(rollouts(), "step_2", "train_rollouts_gsm8k.jsonl");
    await mkdir(path.dirname(bad), { recursive: true });
    await writeFile(bad, "{oops\n");
    const replay = source();
    const error = await replay.load().then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect((error as ReplayError).code).toBe("invalid_checkpoint_state");
    expect(replay.size).toBe(0);
    await writeFile(bad, JSON.stringify(linearTrace(traceId(2), 0)) + "\n");
    await replay.reload();
    expect(names(replay.tasks)).toEqual(["recheck:00000001", "recheck:00000002"]);
  });

  it("refuses a record nested thousands of levels deep with invalid_checkpoint_state, not a stack overflow, and changes no state", async () => {
    await write(1, [linearTrace(traceId(1), 0)]);
    // Another writer's record (ours cannot encode it): an assistant turn's opaque provider state
    // 5000 arrays deep. JSON.parse takes it; cloning it into a seed overflows the stack.
    const deep = linearTrace(traceId(2), 0);
    const line = JSON.stringify(deep).replace('"The answer is 42."}', `"The answer is 42.","provider_state":${"[".repeat(5000)}${"]".repeat(5000)}}`);
    const bad = path.join(rollouts(), "step_2", "train_rollouts_gsm8k.jsonl");
    await mkdir(path.dirname(bad), { recursive: true });
    await writeFile(bad, line + "\n");
    const replay = source();
    const error = await replay.load().then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("train_rollouts_gsm8k.jsonl:1") });
    expect(replay.size).toBe(0);
  });

  it("the writer refuses a record nested deeper than readers take, writing nothing", async () => {
    const deep = linearTrace(traceId(1), 0);
    let nested: unknown = [];
    for (let i = 1; i < 2000; i++) nested = [nested];
    deep.task["notes"] = nested;
    await expect(write(1, [deep])).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("nested") });
    await expect(readFile(path.join(rollouts(), "step_1", "train_rollouts_gsm8k.jsonl"))).rejects.toMatchObject({ code: "ENOENT" });
  });
});

describe("serving tasks to an environment server", () => {
  it("next() hands out each task once, reloading when it runs dry", async () => {
    const replay = source();
    expect(await replay.next()).toBeUndefined();
    await write(1, [linearTrace(traceId(1), 0), linearTrace(traceId(2), 0)]);
    expect((await replay.next())?.name).toBe("recheck:00000001");
    expect((await replay.next())?.name).toBe("recheck:00000002");
    expect(await replay.next()).toBeUndefined();
    await write(2, [linearTrace(traceId(3), 0)]);
    expect((await replay.next())?.name).toBe("recheck:00000003");
  });

  it("taskAt() reloads once for an index past the end and refuses a missing one", async () => {
    const replay = source();
    await write(1, [linearTrace(traceId(1), 0)]);
    expect((await replay.taskAt(0)).name).toBe("recheck:00000001");
    await expect(replay.taskAt(1)).rejects.toMatchObject({ code: "invalid_request" });
    await expect(replay.taskAt(-1)).rejects.toMatchObject({ code: "invalid_request" });
  });

  it("taskAt() and next() that join a reload begun before a new file appeared reload once more before refusing", async () => {
    for (const ask of ["taskAt", "next"] as const) {
      await rm(path.join(dir, "run"), { recursive: true, force: true });
      await write(1, [linearTrace(traceId(1), 0)]);
      const replay = source();
      await replay.load();
      expect(ask === "next" ? (await replay.next())?.name : replay.size).toBe(ask === "next" ? "recheck:00000001" : 1);
      // Hold the next reload after it expanded its globs (finding nothing new), still in flight.
      const load = (replay as unknown as { loadNewFiles(): Promise<unknown> }).loadNewFiles.bind(replay);
      let parsed!: () => void;
      let release!: () => void;
      const globbed = new Promise<void>((resolve) => (parsed = resolve));
      const gate = new Promise<void>((resolve) => (release = resolve));
      let calls = 0;
      (replay as unknown as { loadNewFiles(): Promise<unknown> }).loadNewFiles = async () => {
        const result = await load();
        if (calls++ === 0) {
          parsed();
          await gate;
        }
        return result;
      };
      const periodic = replay.reload();
      await globbed;
      await write(2, [linearTrace(traceId(2), 0)]); // on disk before the request below arrives
      const asked = ask === "taskAt" ? replay.taskAt(1) : replay.next();
      release();
      expect((await asked)?.name).toBe("recheck:00000002");
      await periodic;
      expect(calls).toBe(2);
    }
  });

  it("iterates current tasks, and a polling iterator ends on close()", async () => {
    await write(1, [linearTrace(traceId(1), 0), linearTrace(traceId(2), 0)]);
    expect(names(await collect(source()))).toEqual(["recheck:00000001", "recheck:00000002"]);
    const polling = source({ poll_interval_ms: 3_600_000 });
    const it = polling[Symbol.asyncIterator]();
    expect((await it.next()).value?.name).toBe("recheck:00000001");
    expect((await it.next()).value?.name).toBe("recheck:00000002");
    const pending = it.next(); // now waiting for new records
    polling.close();
    expect(await pending).toEqual({ done: true, value: undefined });
  });

  it("a polling iterator whose reload fails (a corrupt file) warns and tries again at the next poll, instead of ending", async () => {
    await write(1, [linearTrace(traceId(1), 0)]);
    const bad = path.join(rollouts(), "step_2", "train_rollouts_gsm8k.jsonl");
    await mkdir(path.dirname(bad), { recursive: true });
    await writeFile(bad, "{oops\n");
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(line) });
    const polling = new ReplayTaskSource<MathTask, string, number>(
      { records: "run/rollouts/step_*/train_rollouts_gsm8k.jsonl", source: { id: "gsm8k" }, mode: "recheck", poll_interval_ms: 20 },
      mathSource(),
      { cwd: dir, logger },
    );
    const it = polling[Symbol.asyncIterator]();
    try {
      const first = it.next();
      await waitUntil(() => lines.some((l) => l.includes("replay reload failed")), "the failed reload's warning", 5_000);
      await writeFile(bad, JSON.stringify(linearTrace(traceId(2), 0)) + "\n"); // repaired
      expect((await first).value?.name).toBe("recheck:00000001");
      expect((await it.next()).value?.name).toBe("recheck:00000002");
    } finally {
      polling.close();
    }
  });

  it("serialises concurrent reloads", async () => {
    await write(1, [linearTrace(traceId(1), 0)]);
    const replay = source();
    const [a, b] = await Promise.all([replay.reload(), replay.reload()]);
    expect(a).toBe(b);
    expect(replay.size).toBe(1);
  });
});
