import { createHash } from "node:crypto";
import { branches, snapshotRefs } from "./trace-graph.js";
import type { Message, MessageNode, Prompt, TraceRecord } from "./trace-record.js";
import { sampleSorted, seededRandom, type RandomFactory } from "./seeded-random.js";

/**
 * Anchors are the well-formed resume points of a finished rollout. A seed is the prompt rebuilt
 * from the conversation up to an anchor. All detection is structural (roles, the branch graph,
 * tool-call ids); message text is never matched.
 */

export type AnchorKind = "compaction" | "tool-call" | "final";

export interface Seed {
  prompt: Prompt;
  name: string;
  /** Estimated context length: recorded token ids when present, else characters / 4. */
  tokens: number;
  /** Sandbox snapshot ref of the anchor node, when the record carries snapshots. */
  snapshot: string | null;
  anchor: AnchorKind;
  /** Index of the anchor node in trace.nodes (the fork node, last tool result, or final node: recheck's last kept node when a tool result was cut). */
  anchorNode: number;
}

/**
 * The 8-hex-char trace tag in seed names (docs/replay.md). A uuid4-hex id (32+ lowercase hex chars) keeps its first
 * 8 chars; any other id (`rollout-1`, `rollout-2`, …) would share a prefix, so it is tagged by the
 * first 8 hex chars of its sha256 instead.
 */
function traceTag(id: string): string {
  return /^[0-9a-f]{32,}$/.test(id) ? id.slice(0, 8) : createHash("sha256").update(id, "utf8").digest("hex").slice(0, 8);
}
const id8 = (trace: TraceRecord) => traceTag(trace.id);
const messageOf = (trace: TraceRecord, node: number): Message => trace.nodes[node]!.message;

/** Characters that count towards the fallback token estimate. */
function messageChars(message: Message): number {
  let chars = 0;
  const content = message.content;
  if (typeof content === "string") chars += content.length;
  else if (Array.isArray(content)) for (const part of content) if (part.type === "text") chars += part.text.length;
  if (message.role === "assistant") {
    chars += message.reasoning_content?.length ?? 0;
    for (const call of message.tool_calls ?? []) chars += call.name.length + call.arguments.length;
  }
  return chars;
}

/** Sum of recorded token ids; records without tokens (e.g. relayed eval records) fall back to chars / 4. */
export function estimateTokens(nodes: readonly MessageNode[]): number {
  const recorded = nodes.reduce((n, node) => n + node.token_ids.length, 0);
  if (recorded > 0) return recorded;
  return Math.floor(nodes.reduce((n, node) => n + messageChars(node.message), 0) / 4);
}

/** `value` and everything in it made read-only (plain JSON data: objects and arrays). */
function deepFreeze<V>(value: V): V {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    for (const inner of Object.values(value)) deepFreeze(inner);
    Object.freeze(value);
  }
  return value;
}

/**
 * One read-only copy of each of a record's messages, made when first asked for. The seeds of one
 * record share them: a copy per seed would make a record of n anchors hold about n² messages (every
 * seed repeats the conversation up to its anchor), and frozen, no task can change another's prompt.
 */
function sharedMessages(trace: TraceRecord): (node: number) => Message {
  const copies = new Map<number, Message>();
  return (node) => {
    let copy = copies.get(node);
    if (copy === undefined) copies.set(node, (copy = deepFreeze(structuredClone(messageOf(trace, node)))));
    return copy;
  };
}

/** The harness re-emits the system prompt, so seeds never carry the recorded one. */
function withoutLeadingSystem(messages: Message[]): Message[] {
  return messages[0]?.role === "system" ? messages.slice(1) : messages;
}

function stable(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(stable).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${stable(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

function samePrompt(seed: Prompt, task: Prompt | null): boolean {
  if (task === null) return false;
  // Compare as messages so a string prompt equals its one-user-message form.
  const asMessages = (p: Prompt): Message[] =>
    typeof p === "string" ? [{ role: "user", content: p }] : withoutLeadingSystem(p);
  return stable(asMessages(seed)) === stable(asMessages(task));
}

/**
 * continue/compaction: a later branch that shares at least one node with earlier branches and
 * diverges before its first sampled node, launched from system/user messages only, is a restart.
 * Every restart is seeded (max_anchors does not apply).
 */
export function compactionSeeds(trace: TraceRecord): Seed[] {
  const all = branches(trace);
  if (all.length < 2) return [];
  const refs = snapshotRefs(trace);
  const seen = new Set(all[0]);
  const seeds: Seed[] = [];
  for (const branch of all.slice(1)) {
    let fork = branch.findIndex((n) => !seen.has(n));
    if (fork === -1) fork = branch.length;
    for (const n of branch) seen.add(n);
    let firstSampled = branch.findIndex((n) => trace.nodes[n]!.sampled);
    if (firstSampled === -1) firstSampled = branch.length;
    // Sharing nothing means a separate conversation; diverging after sampling is no restart.
    if (fork < 1 || fork >= firstSampled) continue;
    const forkNode = branch[fork]!;
    if (refs.size > 0 && !refs.has(forkNode)) continue;
    const context = branch.slice(0, firstSampled).map((n) => trace.nodes[n]!);
    // Assistant or tool copies in the launch context mean a retokenization split, not a restart.
    if (context.some((node) => node.message.role !== "system" && node.message.role !== "user")) continue;
    const messages = context.map((node) => node.message);
    const [first, second] = messages;
    const prompt: Prompt =
      messages.length === 2 && first?.role === "system" && second?.role === "user" && typeof second.content === "string"
        ? second.content
        : deepFreeze(structuredClone(withoutLeadingSystem(messages)));
    // An auxiliary branch sorting first makes the main branch's own launch look like a restart.
    if (samePrompt(prompt, trace.task.prompt)) continue;
    seeds.push({
      prompt,
      name: `continue:${id8(trace)}:compaction${seeds.length}`,
      tokens: estimateTokens(context),
      snapshot: refs.get(forkNode) ?? null,
      anchor: "compaction",
      anchorNode: forkNode,
    });
  }
  return seeds;
}

/** The tool-call ids of an assistant turn that issued calls, or null. */
function issuedCalls(message: Message): string[] | null {
  if (message.role !== "assistant" || !message.tool_calls || message.tool_calls.length === 0) return null;
  return message.tool_calls.map((call) => call.id);
}

/**
 * A tool run answers a turn exactly when its result ids are the issuer's call ids, each once. Calls
 * sharing an id never are: one result cannot say which of them it answers, and the other dangles.
 */
function answersExactly(calls: readonly string[], results: readonly string[]): boolean {
  const wanted = new Set(calls);
  return wanted.size === calls.length && results.length === wanted.size && new Set(results).size === results.length && results.every((id) => wanted.has(id));
}

export interface ToolCallOptions {
  /** null keeps every candidate; otherwise a seeded uniform draw of this many, in trajectory order. */
  maxAnchors: number | null;
  seed: number;
  random?: RandomFactory;
}

/** continue/tool-call: resume right after each complete tool-result run. */
export function toolCallSeeds(trace: TraceRecord, options: ToolCallOptions): Seed[] {
  const refs = snapshotRefs(trace);
  const seenTools = new Set<number>();
  const candidates: Array<{ branch: number[]; end: number; tokens: number; name: string }> = [];
  const perEnd = new Map<number, number>();
  for (const branch of branches(trace)) {
    const prefix: number[] = [];
    let running = 0;
    for (const n of branch) prefix.push((running += trace.nodes[n]!.token_ids.length));
    // A prompt through an earlier dangling call or orphan result is no resume point, however
    // complete its last run is: no anchor at or past the first malformed message.
    const malformed = firstMalformed(branch.map((n) => messageOf(trace, n)));
    for (let end = 0; end < Math.min(branch.length, malformed); end++) {
      const node = branch[end]!;
      if (messageOf(trace, node).role !== "tool" || seenTools.has(node)) continue;
      seenTools.add(node); // a tool node shared by several branches is considered once
      if (refs.size > 0 && !refs.has(node)) continue;
      const next = branch[end + 1];
      if (next !== undefined && messageOf(trace, next).role === "tool") continue; // not the end of its run
      let start = end;
      while (start > 0 && messageOf(trace, branch[start - 1]!).role === "tool") start--;
      const issuer = start > 0 ? messageOf(trace, branch[start - 1]!) : undefined;
      const calls = issuer ? issuedCalls(issuer) : null;
      if (!calls) continue;
      const results = branch.slice(start, end + 1).map((n) => {
        const m = messageOf(trace, n);
        return m.role === "tool" ? m.tool_call_id : "";
      });
      if (!answersExactly(calls, results)) continue; // partial runs leave dangling calls
      // Names come from the full candidate set so a draw never renames a seed.
      const count = perEnd.get(end) ?? 0;
      perEnd.set(end, count + 1);
      const name = `continue:${id8(trace)}:tool-call${end}${count > 0 ? `-${count}` : ""}`;
      candidates.push({ branch, end, tokens: prefix[end]!, name });
    }
  }
  let chosen = candidates;
  if (options.maxAnchors !== null && options.maxAnchors < candidates.length) {
    const random = (options.random ?? seededRandom)(`${options.seed}:${trace.id}`);
    chosen = sampleSorted(candidates.length, options.maxAnchors, random).map((i) => candidates[i]!);
  }
  const shared = sharedMessages(trace);
  return chosen.map(({ branch, end, tokens, name }) => {
    const nodes = branch.slice(0, end + 1);
    const anchorNode = branch[end]!;
    return {
      prompt: withoutLeadingSystem(nodes.map(shared)),
      name,
      tokens: tokens > 0 ? tokens : estimateTokens(nodes.map((n) => trace.nodes[n]!)),
      snapshot: refs.get(anchorNode) ?? null,
      anchor: "tool-call",
      anchorNode,
    };
  });
}

/**
 * recheck: the final branch with truncation artifacts removed, plus a check-your-work turn.
 * Cut before the first turn whose tool calls are not answered exactly (or the first tool result
 * with no issuer before its run), then drop trailing
 * unanswered user turns; with no sampled answer left there is nothing to check.
 */
export function recheckSeed(trace: TraceRecord, recheckPrompt: string): Seed | null {
  const all = branches(trace);
  const branch = all[all.length - 1];
  if (!branch || branch.length === 0) return null;
  const refs = snapshotRefs(trace);

  // The same cut as the tool-call anchors': an unanswered call, or a tool result no turn issued,
  // would hand the model a context no provider accepts.
  let kept = branch.slice(0, firstMalformed(branch.map((n) => messageOf(trace, n))));
  while (kept.length > 0 && messageOf(trace, kept[kept.length - 1]!).role === "user") kept = kept.slice(0, -1);
  const keptNodes = kept.map((n) => trace.nodes[n]!);
  if (!keptNodes.some((node) => node.sampled && node.message.role === "assistant")) return null;
  // The final node's sandbox holds every tool run before it: with a tool result cut from the seed,
  // it is not the seed's sandbox, and the anchor is the kept prefix's end instead.
  const cutTool = branch.slice(kept.length).some((n) => messageOf(trace, n).role === "tool");
  const anchorNode = cutTool ? kept[kept.length - 1]! : branch[branch.length - 1]!;
  if (refs.size > 0 && !refs.has(anchorNode)) return null;

  const prompt: Message[] = deepFreeze([
    ...structuredClone(withoutLeadingSystem(keptNodes.map((node) => node.message))),
    { role: "user", content: recheckPrompt },
  ]);
  return {
    prompt,
    name: `recheck:${id8(trace)}`,
    tokens: estimateTokens(keptNodes) + Math.floor(recheckPrompt.length / 4),
    snapshot: refs.get(anchorNode) ?? null,
    anchor: "final",
    anchorNode,
  };
}

/**
 * The seeded context as prompt nodes of the new rollout: never sampled, no trainable tokens,
 * so only the model's new completions carry loss.
 */
export function seededContextNodes(prompt: Prompt): MessageNode[] {
  const messages: Message[] = typeof prompt === "string" ? [{ role: "user", content: prompt }] : prompt;
  return messages.map((message, i) => ({
    parent: i === 0 ? null : i - 1,
    message: structuredClone(message),
    sampled: false,
    token_ids: [],
    mask: [],
    logprobs: [],
  }));
}

/**
 * A conversation is a well-formed resume point when every turn that issued tool calls is
 * answered by exactly its run of results and it ends waiting for the model (a user turn or a
 * complete tool run): the same predicates the anchors use, for contexts that come from elsewhere
 * (a checkpoint's parked episodes).
 */
export function isResumePoint(messages: readonly Message[]): boolean {
  const last = messages[messages.length - 1];
  if (!last || (last.role !== "user" && last.role !== "tool")) return false;
  return firstMalformed(messages) === messages.length;
}

/**
 * Position of the first message no well-formed prefix may reach: a turn whose tool calls its run
 * of results does not answer exactly, or a tool result with no issuer before its run. The length
 * when there is none.
 */
function firstMalformed(messages: readonly Message[]): number {
  for (let i = 0; i < messages.length; i++) {
    const message = messages[i]!;
    if (message.role === "tool") {
      // Every tool result belongs to the run right after its issuer (checked from the issuer).
      const prev = messages[i - 1];
      if (!prev || (prev.role !== "tool" && !issuedCalls(prev))) return i;
      continue;
    }
    const calls = issuedCalls(message);
    if (!calls) continue;
    const results: string[] = [];
    for (let j = i + 1; j < messages.length && messages[j]!.role === "tool"; j++) {
      const m = messages[j]!;
      if (m.role === "tool") results.push(m.tool_call_id);
    }
    if (!answersExactly(calls, results)) return i;
  }
  return messages.length;
}
