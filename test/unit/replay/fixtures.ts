import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { pino } from "pino";
import { z } from "zod";
import { PromptSchema, type Message, type MessageNode, type TraceRecord } from "../../../participants/replay/index.js";
import type { SourceEnvironment } from "../../../participants/replay/index.js";

export const silent = pino({ level: "silent" });

/** Builds a trace's node graph one message at a time. Token ids are fake but non-empty for each node. */
export class TraceBuilder {
  readonly nodes: MessageNode[] = [];

  add(parent: number | null, message: Message, sampled = false): number {
    const size = 2 + Math.floor(JSON.stringify(message).length / 8);
    this.nodes.push({
      parent,
      message,
      sampled,
      token_ids: Array.from({ length: size }, (_, i) => i + 1),
      mask: Array.from({ length: size }, () => sampled),
      logprobs: sampled ? Array.from({ length: size }, () => -0.5) : [],
    });
    return this.nodes.length - 1;
  }

  /** Appends a chain of messages under `parent`; returns the last node index. */
  chain(parent: number | null, messages: Array<[Message, boolean?]>): number {
    let last = parent;
    for (const [message, sampled] of messages) last = this.add(last, message, sampled ?? false);
    return last!;
  }

  trace(id: string, extra: Partial<TraceRecord> & { prompt?: TraceRecord["task"]["prompt"]; answer?: string } = {}): TraceRecord {
    const { prompt, answer, ...rest } = extra;
    return {
      id,
      task: { idx: 0, name: "gsm8k", prompt: prompt ?? TASK_PROMPT, answer: answer ?? "42" },
      nodes: this.nodes,
      rewards: { correct: 1 },
      metrics: {},
      info: {},
      is_completed: true,
      stop_condition: null,
      errors: [],
      ...rest,
    };
  }
}

export const TASK_PROMPT = "What is six times seven?";
export const SYSTEM: Message = { role: "system", content: "You are a careful solver." };
export const sys = (): Message => SYSTEM;
export const user = (content: string): Message => ({ role: "user", content });
export const say = (content: string): Message => ({ role: "assistant", content });
export const call = (...ids: string[]): Message => ({
  role: "assistant",
  content: null,
  tool_calls: ids.map((id) => ({ id, name: "python", arguments: JSON.stringify({ code: `print(${id.length})` }) })),
});
export const result = (id: string, content = "ok"): Message => ({ role: "tool", tool_call_id: id, content });

export function traceId(n: number): string {
  return n.toString(16).padStart(8, "0") + "a".repeat(24);
}

/** Linear: system, task user, one sampled answer. One branch. */
export function linearTrace(id: string, reward = 1, name: string | null = "gsm8k"): TraceRecord {
  const b = new TraceBuilder();
  b.chain(null, [[sys()], [user(TASK_PROMPT)], [say("The answer is 42."), true]]);
  const t = b.trace(id, { rewards: { correct: reward } });
  t.task.name = name;
  return t;
}

export const RESTART = "Summary so far: computed 6*7 with python; result 42. Continue from here.";

/**
 * The rlm compaction shape. Branch A (nodes 0-5): tool use, a compaction request, the handoff summary.
 * Branch B re-roots at the shared system node with the summary as a fresh user message (6-9).
 */
export function compactedTrace(id: string, reward = 1): TraceRecord {
  const b = new TraceBuilder();
  const root = b.add(null, sys());
  b.chain(root, [
    [user(TASK_PROMPT)],
    [call("c1"), true],
    [result("c1", "42")],
    [user("Please write a checkpoint compaction of your progress.")],
    [say("Handoff: 6*7=42 via python."), true],
  ]);
  b.chain(root, [[user(RESTART)], [call("c2"), true], [result("c2", "42")], [say("Final answer: 42"), true]]);
  return b.trace(id, { rewards: { correct: reward } });
}

/** Typed task of the source environment: a gsm8k-like task with a reference answer. */
export const MathTaskSchema = z
  .object({ idx: z.number().int(), name: z.string().nullable(), prompt: PromptSchema.nullable(), answer: z.string() })
  .strict();
export type MathTask = z.infer<typeof MathTaskSchema>;

export function mathSource(overrides: Partial<SourceEnvironment<MathTask, string, number>> = {}): SourceEnvironment<MathTask, string, number> {
  return {
    id: "gsm8k",
    taskSchema: MathTaskSchema,
    configSchema: z.object({ id: z.literal("gsm8k"), split: z.enum(["train", "test"]).default("train") }).strict(),
    score: (task, rollout) => (rollout.includes(task.answer) ? 1 : 0),
    ...overrides,
  };
}

export async function tempDir(): Promise<{ dir: string; cleanup: () => Promise<void> }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "replay-test-"));
  return { dir, cleanup: () => rm(dir, { recursive: true, force: true }) };
}


/**
 * Hand-assembles a record file and a matching index (offsets filled cumulatively, `len` = encoded
 * line length including "\n"), so tests can plant invalid bytes where the index says to skip.
 */
export async function writeHandIndexed(
  dir: string,
  fileName: string,
  entries: Array<{ line: string; row: { trace: string; task_name: string | null; reward: number; branches: number; task_idx?: number } }>,
): Promise<{ recordPath: string; indexPath: string; size: number }> {
  const { createHash } = await import("node:crypto");
  const { mkdir, writeFile } = await import("node:fs/promises");
  const { encodeIndex, indexPathFor, parseRecordFileName } = await import("../../../participants/replay/index.js");
  await mkdir(dir, { recursive: true });
  const data = Buffer.from(entries.map((e) => e.line + "\n").join(""), "utf8");
  let offset = 0;
  const rows = entries.map((e) => {
    const len = Buffer.byteLength(e.line + "\n");
    const row = { task_idx: 0, policy_version: 0, step: 1, turns: 1, stop: null, ...e.row, offset, len };
    offset += len;
    return row;
  });
  const names = parseRecordFileName(fileName)!;
  const recordPath = path.join(dir, fileName);
  const indexPath = indexPathFor(recordPath)!;
  const header = {
    format: "gym-ckpt/rollout-index" as const,
    version: 1 as const,
    kind: names.kind,
    env: names.env,
    step: 1,
    record_file: fileName,
    size: data.length,
    sha256: createHash("sha256").update(data).digest("hex"),
    records: rows.length,
  };
  await writeFile(recordPath, data);
  await writeFile(indexPath, encodeIndex(header, rows));
  return { recordPath, indexPath, size: data.length };
}

export async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}
