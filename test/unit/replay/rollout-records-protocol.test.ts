import { readFile, readdir } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  CheckpointError,
  RunTrajectorySchema,
  encodeRolloutIndex,
  encodeRolloutRecords,
  rolloutBatchFit,
  rolloutRecordPaths,
  TraceRecordSchema,
  traceRecordFromTrajectory,
  traceReward,
} from "../../../protocol/index.js";
import { encodeRecordLines, rolloutIndexLine } from "../../../protocol/rollout-records.js";
import {
  ReplayTaskSource,
  chatTrajectory,
  chatToMessage,
  isResumePoint,
  messageToChat,
  newReadStats,
  promptToChat,
  readRecords,
  writeRolloutRecords,
  type ChatMessageLike,
  type TraceRecord,
} from "../../../participants/replay/index.js";
import { call, compactedTrace, linearTrace, mathSource, result, say, silent, sys, tempDir, traceId, user } from "./fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

describe("protocol rollout-record encoding", () => {
  it("is byte-identical to what the replay record writer publishes", async () => {
    const traces = [linearTrace(traceId(1), 0), compactedTrace(traceId(2), 1)];
    traces[1]!.nodes[1]!.message = { role: "user", content: "6×7 = ? 漢字 🙂" }; // multibyte shifts the second span
    const encoded = encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records: traces, policyVersion: [2, 3] });
    const written = await writeRolloutRecords(dir, 4, { kind: "train", env: "gsm8k", traces, policyVersion: (_t, i) => 2 + i });
    expect(encoded.recordFile).toBe("step_4/train_rollouts_gsm8k.jsonl");
    expect(encoded.indexFile).toBe("step_4/index_train_gsm8k.jsonl");
    expect(await readFile(written.recordPath)).toEqual(encoded.recordBytes);
    expect(await readFile(written.indexPath)).toEqual(encoded.indexBytes);
    expect(encoded.rows.map((r) => [r.offset, r.len, r.policy_version, r.branches])).toEqual([
      [0, Buffer.byteLength(JSON.stringify(traces[0]) + "\n"), 2, 1],
      [Buffer.byteLength(JSON.stringify(traces[0]) + "\n"), Buffer.byteLength(JSON.stringify(traces[1]) + "\n"), 3, 2],
    ]);
    expect(encoded.header.size).toBe(encoded.recordBytes.length);
  });

  it("encodes an index longer than the longest string: never built as one string, it cannot throw V8's RangeError", () => {
    const traces = Array.from({ length: 64 }, (_, i) => linearTrace(traceId(i + 1), i % 2));
    const { header, rows, indexBytes } = encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records: traces });
    expect(indexBytes.length).toBeGreaterThan(4096);
    // V8 throws `RangeError: Invalid string length` past MAX_STRING_LENGTH (512 MiB), which the index
    // of a few million records reaches. Not allocated here: a join past 4 KiB throws as V8's past it.
    const join = Array.prototype.join;
    const spy = vi.spyOn(Array.prototype, "join").mockImplementation(function (this: unknown[], separator?: string) {
      const joined = join.call(this, separator);
      if (joined.length > 4096) throw new RangeError("Invalid string length");
      return joined;
    });
    try {
      expect(encodeRolloutIndex(header, rows)).toEqual(indexBytes);
    } finally {
      spy.mockRestore();
    }
    const lines = indexBytes.toString("utf8").split("\n");
    expect(lines.slice(0, -1).map((line) => JSON.parse(line) as unknown)).toEqual([header, ...rows]);
    expect(lines.at(-1)).toBe("");
  });

  it("refuses a record whose index row V8 cannot make a string of (its line fits, the row is longer): invalid_request, no RangeError", () => {
    // A row repeats its record's id, task name and stop condition with ~100 characters of its own:
    // a record whose line is just under MAX_STRING_LENGTH has a row over it (an id of
    // MAX_STRING_LENGTH - 100 characters did so). Not allocated here: JSON.stringify of a row throws
    // as V8's does past the longest string.
    const stringify = JSON.stringify;
    const spy = vi.spyOn(JSON, "stringify").mockImplementation(function (value: unknown, ...rest: unknown[]) {
      if (value !== null && typeof value === "object" && "trace" in value && "offset" in value) throw new RangeError("Invalid string length");
      return (stringify as (...args: unknown[]) => string)(value, ...rest);
    });
    let error: unknown;
    try {
      encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records: [linearTrace(traceId(1))] });
    } catch (caught) {
      error = caught;
    } finally {
      spy.mockRestore();
    }
    expect(error).toBeInstanceOf(CheckpointError);
    expect(error).toMatchObject({ code: "invalid_request", message: expect.stringMatching(/^record 0's index row is longer than the longest string/) });
  });

  it("an index line is refused where it, with its newline, would pass the longest string", () => {
    const { header, rows } = encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records: [linearTrace(traceId(1)), linearTrace(traceId(2))] });
    const row = rows[1]!;
    const length = JSON.stringify(row).length;
    expect(rolloutIndexLine(row, 2, length + 1)).toBe(JSON.stringify(row) + "\n");
    expect(() => rolloutIndexLine(row, 2, length)).toThrow(/^record 1's index row is longer than the longest string \(\d+ characters\)/);
    expect(() => rolloutIndexLine(header, 0, 10)).toThrow(CheckpointError);
  });

  it("a record line is refused where the record's JSON, with its newline, would pass the limit: invalid_request, not V8's RangeError", () => {
    // At the real limit (MAX_STRING_LENGTH), a record whose JSON is exactly that long threw
    // `RangeError: Invalid string length` when its newline was added; the limit is injected here so
    // nothing is allocated. Multibyte text counts in bytes.
    const record = { id: "r1", text: "6×7 🙂" };
    const json = JSON.stringify(record);
    const bytes = Buffer.byteLength(json, "utf8");
    expect(bytes).toBeGreaterThan(json.length);
    expect(encodeRecordLines([record], bytes + 1)).toEqual({ bytes: Buffer.from(json + "\n", "utf8"), spans: [{ offset: 0, len: bytes + 1 }] });
    for (const limit of [bytes, json.length]) {
      let error: unknown;
      try {
        encodeRecordLines([{ fits: 1 }, record], limit);
      } catch (caught) {
        error = caught;
      }
      expect(error).toBeInstanceOf(CheckpointError);
      expect(error).toMatchObject({ code: "invalid_request", message: `record 1 is ${bytes + 1} bytes as a JSON line, longer than any reader can decode (${limit})` });
    }
  });

  it("a batch whose record lines together pass one buffer's limit is refused invalid_request, naming its size, the limit and how many records fit", () => {
    // At the real limit (buffer.constants.MAX_LENGTH, 4 GiB on Node 20), Buffer.concat threw a bare
    // RangeError, which the collector retried at every flush; injected here so nothing is allocated.
    const records = [{ id: "a" }, { id: "b", text: "6×7 🙂" }, { id: "c" }];
    const lines = records.map((record) => Buffer.from(`${JSON.stringify(record)}\n`, "utf8"));
    const total = lines.reduce((sum, line) => sum + line.length, 0);
    expect(encodeRecordLines(records, 1 << 20, total).bytes).toEqual(Buffer.concat(lines));
    const refusal = (maxLineBytes: number, maxBatchBytes: number) => {
      try {
        encodeRecordLines(records, maxLineBytes, maxBatchBytes);
      } catch (error) {
        return error;
      }
      return undefined;
    };
    for (const [limit, fitting] of [[total - 1, 2], [lines[0]!.length + lines[1]!.length, 2], [lines[0]!.length + lines[1]!.length - 1, 1], [lines[0]!.length - 1, 0]] as const) {
      const error = refusal(1 << 20, limit);
      expect(error).toBeInstanceOf(CheckpointError);
      expect(error).toMatchObject({
        code: "invalid_request",
        message: `the record file of a batch of 3 records would be ${total} bytes, over the ${limit} one buffer can hold: split the batch (its first ${fitting} records fit)`,
      });
      expect(rolloutBatchFit(error)).toBe(fitting);
      // What fits does encode at that limit.
      expect(encodeRecordLines(records.slice(0, fitting), 1 << 20, limit).bytes).toEqual(Buffer.concat(lines.slice(0, fitting)));
    }
    // A record's own refusal is no batch refusal: nothing to split.
    const lineRefusal = refusal(5, total);
    expect(lineRefusal).toMatchObject({ code: "invalid_request", message: expect.stringMatching(/^record 0 is \d+ bytes as a JSON line/) });
    expect(rolloutBatchFit(lineRefusal)).toBeUndefined();
  });

  it("a batch whose index passes one buffer's limit (its records fit) is refused invalid_request, naming its size, the limit and how many records fit", () => {
    // Rows are longer than small records: tens of millions of them pass 4 GiB before their file does.
    const records = [1, 2, 3, 4].map((n) => ({ id: `r${n}`, task: { idx: n, name: null, prompt: null }, nodes: [], rewards: {} }));
    const { recordBytes, indexBytes } = encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records });
    const limit = indexBytes.length - 1;
    expect(recordBytes.length).toBeLessThanOrEqual(limit);
    let error: unknown;
    try {
      encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records }, limit);
    } catch (caught) {
      error = caught;
    }
    expect(error).toBeInstanceOf(CheckpointError);
    expect(error).toMatchObject({
      code: "invalid_request",
      message: `the index of a batch of 4 records would be ${indexBytes.length} bytes, over the ${limit} one buffer can hold: split the batch (its first 3 records fit)`,
    });
    expect(rolloutBatchFit(error)).toBe(3);
    expect(encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records: records.slice(0, 3) }, limit).header.records).toBe(3);
    expect(encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records }, indexBytes.length).indexBytes).toEqual(indexBytes);
    // A row's own refusal is no batch refusal.
    expect(rolloutBatchFit(new CheckpointError("invalid_request", "record 0 is too long"))).toBeUndefined();
  });

  // zod builds a record by assignment: a reward named __proto__ vanished, and the record read back
  // with reward 0 (a correct attempt selected as an incorrect one by max_source_reward).
  it("keeps a reward, metric, info or task field named __proto__ as data, through the index and a read of the record", () => {
    const trace = TraceRecordSchema.parse(
      JSON.parse(
        `{"id":"${traceId(1)}","task":{"idx":0,"name":"t","prompt":"p","__proto__":{"hint":1}},"nodes":[],"rewards":{"__proto__":1},"metrics":{"__proto__":2},"info":{"__proto__":"x"}}`,
      ),
    );
    expect(traceReward(trace)).toBe(1);
    const { recordBytes, rows } = encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 4, records: [trace] });
    expect(rows[0]!.reward).toBe(1);
    const read = TraceRecordSchema.parse(JSON.parse(Buffer.from(recordBytes).toString("utf8").trim()));
    for (const field of [read.task, read.rewards, read.metrics!, read.info!]) expect(Object.keys(field)).toContain("__proto__");
    expect(traceReward(read)).toBe(1);
    // Still a number map: a __proto__ reward that is not a number is refused like any other.
    expect(TraceRecordSchema.safeParse(JSON.parse(`{"id":"${traceId(2)}","task":{"idx":0,"name":null,"prompt":null},"nodes":[],"rewards":{"__proto__":"1"}}`)).success).toBe(false);
  });

  // zod reads through getters and inherited properties, JSON.stringify writes own enumerable ones:
  // the caller's object was written, so a record validated with rewards { correct: 1 } and indexed
  // with reward 1 had a line without rewards, and every later read of its file failed.
  it("writes what it validated: a field JSON does not see in the caller's object is in the line, which reads back on both paths", async () => {
    const hidden = linearTrace(traceId(1)) as Partial<TraceRecord>;
    delete hidden.rewards;
    Object.defineProperty(hidden, "rewards", { get: () => ({ correct: 1 }), enumerable: false });
    const written = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [hidden as TraceRecord, linearTrace(traceId(2), 0)] });
    const line = JSON.parse((await readFile(written.recordPath, "utf8")).split("\n")[0]!) as TraceRecord;
    expect(line.rewards).toEqual({ correct: 1 });
    for (const useIndex of [true, false]) {
      const stats = newReadStats();
      const read = [];
      for await (const record of readRecords(written.recordPath, { filters: { minReward: null, maxReward: null, minBranches: 1 }, stats, logger: silent, useIndex })) read.push(record);
      expect(read.map((r) => [r.trace.id, traceReward(r.trace)])).toEqual([[traceId(1), 1], [traceId(2), 0]]);
      expect(stats.indexRejected).toBe(0);
    }
  });

  // Writing the validated copy must not change the bytes of an ordinary record: zod builds its
  // objects in the schema's key order, and a retry compares a published file byte for byte.
  it("writes an ordinary record as its own JSON, byte for byte, whatever its key order", () => {
    const reordered = JSON.parse(
      `{"task":{"answer":"42","__proto__":{"hint":1},"prompt":[{"content":"p","role":"user"}],"name":"t","idx":3},"rewards":{"b":1,"__proto__":2,"a":0},` +
        `"nodes":[{"message":{"content":[{"text":"hi","type":"text"}],"role":"user"},"token_ids":[1],"logprobs":[],"mask":[false],"sampled":false,"parent":null},` +
        `{"sampled":true,"parent":0,"message":{"tool_calls":[{"arguments":"{}","name":"python","id":"c1"}],"content":null,"role":"assistant","provider_state":{"z":1,"a":[{"y":1,"b":2}]}},"token_ids":[2],"mask":[true],"logprobs":[-0.5],"usage":{"out":1,"in":2}},` +
        `{"parent":1,"message":{"name":"python","content":"42","tool_call_id":"c1","role":"tool"},"sampled":false,"token_ids":[],"mask":[],"logprobs":[]}],` +
        `"errors":["e",{"y":1,"a":2}],"stop_condition":null,"is_completed":true,"info":{"z":{"b":1,"a":2},"__proto__":"x"},"metrics":{"m":1},"id":"${traceId(1)}","timing":{"b":1,"a":2}}`,
    ) as TraceRecord;
    const records = [reordered, linearTrace(traceId(2)), compactedTrace(traceId(3))];
    const { recordBytes, rows } = encodeRolloutRecords({ kind: "train", env: "gsm8k", step: 1, records });
    expect(recordBytes.toString("utf8")).toBe(records.map((record) => JSON.stringify(record) + "\n").join(""));
    expect(rows[0]!.reward).toBe(3);
  });

  it("refuses bad input with invalid_request and names the paths it would use", () => {
    const refusal = (f: () => unknown) => {
      try {
        f();
      } catch (error) {
        return error;
      }
      return null;
    };
    const cases = [
      () => encodeRolloutRecords({ kind: "train", env: "../x", step: 1, records: [] }),
      () => encodeRolloutRecords({ kind: "train", env: "x", step: -1, records: [] }),
      () => encodeRolloutRecords({ kind: "test" as "train", env: "x", step: 1, records: [] }),
      () => encodeRolloutRecords({ kind: "train", env: "x", step: 1, records: [{ id: "x" }] }),
      () => encodeRolloutRecords({ kind: "train", env: "x", step: 1, records: [linearTrace(traceId(1))], policyVersion: [1, 2] }),
      () => encodeRolloutRecords({ kind: "train", env: "x", step: 1, records: [linearTrace(traceId(1))], policyVersion: 1.5 }),
      // Open-ended task fields JSON cannot encode pass the schema; the encoding refuses them.
      () => encodeRolloutRecords({ kind: "train", env: "x", step: 1, records: [{ ...linearTrace(traceId(1)), task: { ...linearTrace(traceId(1)).task, seed: 1n } }] }),
    ];
    for (const c of cases) {
      const error = refusal(c);
      expect(error).toBeInstanceOf(CheckpointError);
      expect((error as CheckpointError).code).toBe("invalid_request");
    }
    expect(rolloutRecordPaths(9, "eval", "gym")).toEqual({ stepDir: "step_9", recordFile: "step_9/eval_rollouts_gym.jsonl", indexFile: "step_9/index_eval_gym.jsonl" });
  });
});

describe("chat trajectories", () => {
  const conversation: ChatMessageLike[] = [
    { role: "system", content: "You are a calculator." },
    { role: "user", content: "Compute: 6 * 7" },
    { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "calculator", arguments: '{"expression":"6 * 7"}' } }] },
    { role: "tool", tool_call_id: "c1", content: '{"result":42}' },
    { role: "assistant", content: "42" },
  ];

  it("becomes a record whose seeded context is unsampled and which replays like any other record", async () => {
    const trajectory = chatTrajectory({ messages: conversation, seeded: 2, reward: 1, taskName: "gsm8k", prompt: "Compute: 6 * 7", replay: null });
    expect(RunTrajectorySchema.parse(trajectory)).toEqual(trajectory);
    expect(trajectory.turns).toBe(2);
    expect(trajectory.nodes.map((n) => n.sampled)).toEqual([false, false, true, false, true]);
    const record = traceRecordFromTrajectory({ id: traceId(7), taskIdx: 3, task: { answer: "42" }, trajectory, info: { rollout_id: "r" } });
    expect(record.task).toEqual({ answer: "42", idx: 3, name: "gsm8k", prompt: "Compute: 6 * 7" });
    expect(record.rewards).toEqual({ reward: 1 });

    const { recordBytes, indexBytes, recordFile, indexFile } = encodeRolloutRecords({ kind: "eval", env: "calc", step: 1, records: [record] });
    const { mkdir, writeFile } = await import("node:fs/promises");
    await mkdir(path.join(dir, "step_1"));
    await writeFile(path.join(dir, recordFile), recordBytes);
    await writeFile(path.join(dir, indexFile), indexBytes);
    const source = new ReplayTaskSource({ records: "step_*/eval_rollouts_calc.jsonl", source: { id: "gsm8k" }, anchor: "tool-call" }, mathSource(), { cwd: dir, logger: silent });
    await source.load();
    expect(source.tasks.map((t) => [t.name, t.lineage.anchorNode, t.task.answer])).toEqual([[`continue:${traceId(7).slice(0, 8)}:tool-call3`, 3, "42"]]);
    expect(promptToChat(source.tasks[0]!.prompt)).toEqual(conversation.slice(1, 4));
  });

  it("a trajectory's replay lineage keeps a key named __proto__ as data, into the record's info", () => {
    const trajectory = chatTrajectory({ messages: conversation, seeded: 4, reward: 1, taskName: "continue:abcdef12:tool-call3", prompt: null, replay: null });
    const raw = JSON.parse(JSON.stringify({ ...trajectory, replay: "LINEAGE" }).replace(`"LINEAGE"`, `{"mode":"continue","__proto__":{"k":1}}`)) as unknown;
    const parsed = RunTrajectorySchema.parse(raw);
    expect(JSON.stringify(parsed.replay)).toBe(`{"mode":"continue","__proto__":{"k":1}}`);
    const record = traceRecordFromTrajectory({ id: traceId(9), taskIdx: 0, task: {}, trajectory: parsed });
    expect(JSON.stringify(record.info)).toBe(`{"replay":{"mode":"continue","__proto__":{"k":1}}}`);
  });

  it("a replayed record carries its lineage and is never mined again", async () => {
    const trajectory = chatTrajectory({ messages: conversation, seeded: 4, reward: 1, taskName: "continue:abcdef12:tool-call3", prompt: null, replay: { sourceTraceId: "abc" } });
    const record = traceRecordFromTrajectory({ id: traceId(8), taskIdx: 0, task: { answer: "42" }, trajectory });
    expect(record.info).toEqual({ replay: { sourceTraceId: "abc" } });
    expect(record.nodes.filter((n) => n.sampled)).toHaveLength(1);
    const { recordBytes, recordFile } = encodeRolloutRecords({ kind: "train", env: "calc", step: 1, records: [record] });
    const { mkdir, writeFile } = await import("node:fs/promises");
    await mkdir(path.join(dir, "step_1"));
    await writeFile(path.join(dir, recordFile), recordBytes);
    const source = new ReplayTaskSource({ records: "step_*/*.jsonl", source: { id: "gsm8k" }, anchor: "tool-call" }, mathSource(), { cwd: dir, logger: silent });
    await source.load();
    expect(source.size).toBe(0);
    expect(source.stats.read.skipped.replayed).toBe(1);
    expect(await readdir(path.join(dir, "step_1"))).toEqual(["train_rollouts_calc.jsonl"]);
  });

  it("converts messages both ways", () => {
    for (const m of conversation.slice(1)) expect(messageToChat(chatToMessage(m))).toEqual(m);
    expect(promptToChat("hi")).toEqual([{ role: "user", content: "hi" }]);
  });

  it("keep a tool result's name and an assistant turn's reasoning_content both ways", () => {
    const messages: ChatMessageLike[] = [
      { role: "assistant", content: null, reasoning_content: "Use the calculator.", tool_calls: [{ id: "c1", type: "function", function: { name: "calculator", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "c1", name: "calculator", content: "42" },
      { role: "assistant", content: "42", reasoning_content: null },
    ];
    for (const m of messages) expect(messageToChat(chatToMessage(m))).toEqual(m);
    expect(chatToMessage(messages[0]!)).toEqual({ role: "assistant", content: null, reasoning_content: "Use the calculator.", tool_calls: [{ id: "c1", name: "calculator", arguments: "{}" }] });
  });

  it("take an assistant turn's `reasoning` (newer vLLM's name) as its reasoning_content, into a /run trajectory's record too", () => {
    const turns: ChatMessageLike[] = [
      { role: "system", content: "s" },
      { role: "user", content: "q" },
      { role: "assistant", content: "42", reasoning: "6*7" } as ChatMessageLike,
    ];
    const trajectory = chatTrajectory({ messages: turns, seeded: 2, reward: 1, taskName: null, prompt: "q", replay: null });
    expect(trajectory.nodes[2]!.message).toEqual({ role: "assistant", content: "42", reasoning_content: "6*7" });
    expect(RunTrajectorySchema.parse(trajectory)).toEqual(trajectory);
  });
});

describe("resume points", () => {
  it("accept a context ending in a user turn or a complete tool run, and nothing else", () => {
    expect(isResumePoint([user("q")])).toBe(true);
    expect(isResumePoint([user("q"), call("a"), result("a")])).toBe(true);
    expect(isResumePoint([sys(), user("q"), call("a", "b"), result("b"), result("a")])).toBe(true);
    expect(isResumePoint([user("q"), call("a", "b"), result("a")])).toBe(false); // dangling call
    expect(isResumePoint([user("q"), call("a"), result("a"), result("x")])).toBe(false); // foreign result
    expect(isResumePoint([user("q"), say("done")])).toBe(false); // finished, nothing to continue
    expect(isResumePoint([user("q"), call("a"), user("more")])).toBe(false); // call never answered
    expect(isResumePoint([result("a")])).toBe(false);
    expect(isResumePoint([])).toBe(false);
  });
});
