import { execFileSync } from "node:child_process";
import { constants } from "node:buffer";
import { open, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { GLOBAL_MANIFEST_FILE, MANIFEST_SCHEMA_VERSION, canonicalDigest, captureKey, sha256Hex, type EpisodeId, type GlobalManifest, type ParticipantEntry } from "../../../protocol/index.js";
import { FsCheckpointStorage, participantDir } from "../../../participants/storage/fs-storage.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import { DEFAULT_RECHECK_PROMPT, exportCheckpointSeeds, ReplayError } from "../../../participants/replay/index.js";
import { seededState } from "../../../participants/gym/agent-server/tool-calling-agent.js";
import { readTaskFile } from "../../../participants/replay/task-file.js";
import { tempDir } from "./fixtures.js";

/**
 * `exportCheckpointSeeds` reads only what checkpoint.json committed: every participant manifest is
 * checked against the digests and count its entry pins before a record is read, and no file on the
 * way (checkpoint.json included) is waited on when it is a FIFO.
 */
let root: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir: root, cleanup } = await tempDir()));
afterEach(() => cleanup());

const ID = "cp-1";
const checkpointDir = () => path.join(root, ID);
const storage = new FsCheckpointStorage();
const digest = "a".repeat(64);

/** An episode parked where its agent waits for the next model call: one seed. */
function parked(rolloutId: string) {
  const episode_id: EpisodeId = { rollout_id: rolloutId, attempt: 0 };
  const messages = [
    { role: "system", content: "You solve." },
    { role: "user", content: "Compute 6*7." },
    { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "python", arguments: "{}" } }] },
    { role: "tool", tool_call_id: "c1", content: "42" },
  ];
  return {
    environment: { episode_id, task_digest: digest, boundary: { next: "invoke_agent" } },
    agent: { episode_id, mode: "session", session_key: `s-${rolloutId}`, session: {}, boundary: { messages }, episode: null },
  };
}

async function writeParticipant(kind: "environment" | "agent", records: object[], instance = `${kind}0`): Promise<ParticipantEntry> {
  const target = { checkpointDir: checkpointDir(), checkpointId: ID, kind, instance };
  const written = await storage.write(target, records as never, { gate: new WriteGate(), createdAt: 1, extra: {} });
  return {
    kind,
    instance: target.instance,
    manifest_path: written.manifestPath,
    manifest_sha256: written.manifestSha256,
    records_sha256: written.manifest.records_sha256,
    record_count: written.manifest.record_count,
    episode_ids: [...new Set(records.map((r) => captureKey((r as { episode_id: EpisodeId }).episode_id)))].sort(),
    extras: {},
  };
}

async function publish(participants: ParticipantEntry[]): Promise<void> {
  const manifest: GlobalManifest = {
    schema_version: MANIFEST_SCHEMA_VERSION,
    checkpoint_id: ID,
    epoch: 1,
    prepared_at: 1,
    published_at: 2,
    stop: false,
    scope: null,
    restarts: [],
    participants,
    controller_state: null,
  };
  await writeFile(path.join(checkpointDir(), GLOBAL_MANIFEST_FILE), JSON.stringify(manifest));
}

async function refusal(work: Promise<unknown>): Promise<ReplayError> {
  const error = await work.then(() => null, (e: unknown) => e);
  expect(error).toBeInstanceOf(ReplayError);
  return error as ReplayError;
}

describe("checkpoint seeds", () => {
  it("export the committed parked episodes", async () => {
    const r1 = parked("r1");
    await publish([await writeParticipant("environment", [r1.environment]), await writeParticipant("agent", [r1.agent])]);
    const exported = await exportCheckpointSeeds(checkpointDir());
    expect(exported.seeds.map((s) => s.name)).toEqual([`continue:${ID}:r1`]);
    expect(exported.seeds[0]!.lineage).toMatchObject({ boundary: "invoke_agent", turns: 1 });
  });

  it("keep a tool result's name and an assistant turn's reasoning_content, so a replay continues the same conversation", async () => {
    const r1 = parked("r1");
    const messages = [
      { role: "system", content: "You solve." },
      { role: "user", content: "Compute 6*7." },
      { role: "assistant", content: null, reasoning_content: "Use python.", tool_calls: [{ id: "c1", type: "function", function: { name: "python", arguments: "{}" } }] },
      { role: "tool", tool_call_id: "c1", name: "python", content: "42" },
    ];
    const agent = { ...r1.agent, boundary: { messages } };
    await publish([await writeParticipant("environment", [r1.environment]), await writeParticipant("agent", [agent])]);
    const exported = await exportCheckpointSeeds(checkpointDir());
    expect(exported.seeds[0]!.prompt).toEqual([
      { role: "user", content: "Compute 6*7." },
      { role: "assistant", content: null, reasoning_content: "Use python.", tool_calls: [{ id: "c1", name: "python", arguments: "{}" }] },
      { role: "tool", tool_call_id: "c1", name: "python", content: "42" },
    ]);
  });

  // Newer vLLM names an assistant message's reasoning `reasoning`, not `reasoning_content`; an agent that
  // keeps the policy's replies as they came parks it so (a turn-loop snapshot's messages pass unknown
  // keys through). It was dropped: the seed continued another conversation, and seed_tokens left it out.
  it("take an assistant turn's `reasoning` (newer vLLM's name) as its reasoning_content: kept in the prompt and counted in seed_tokens", async () => {
    const r1 = parked("r1");
    const thought = "t".repeat(400);
    const call = { id: "c1", type: "function", function: { name: "python", arguments: "{}" } };
    const turns = (assistant: object) => [
      { role: "system", content: "You solve." },
      { role: "user", content: "Compute 6*7." },
      { role: "assistant", content: null, ...assistant, tool_calls: [call] },
      { role: "tool", tool_call_id: "c1", content: "42" },
    ];
    const r2 = parked("r2");
    const r3 = parked("r3");
    await publish([
      await writeParticipant("environment", [r1.environment, r2.environment, r3.environment]),
      await writeParticipant("agent", [
        { ...r1.agent, boundary: { messages: turns({ reasoning: thought }) } },
        // Both names (vLLM while it sent both, the same text): the record's own name wins, counted once.
        { ...r2.agent, boundary: { messages: turns({ reasoning_content: thought, reasoning: "other" }) } },
        // The record's name left null beside the text under the new one: the text is kept.
        { ...r3.agent, boundary: { messages: turns({ reasoning_content: null, reasoning: thought }) } },
      ]),
    ]);
    const exported = await exportCheckpointSeeds(checkpointDir());
    for (const seed of exported.seeds) {
      expect(seed.prompt).toEqual([
        { role: "user", content: "Compute 6*7." },
        { role: "assistant", content: null, reasoning_content: thought, tool_calls: [{ id: "c1", name: "python", arguments: "{}" }] },
        { role: "tool", tool_call_id: "c1", content: "42" },
      ]);
      // Characters / 4: the user turn (12), the reasoning (400), the call's name and arguments (8), the result (2).
      expect(seed.seed_tokens).toBe(Math.floor((12 + 400 + 8 + 2) / 4));
    }
    expect(exported.seeds).toHaveLength(3);
  });

  it("skip an episode whose agent boundary is not a turn-loop snapshot (another agent's own state) and export the rest", async () => {
    const [r1, r2] = [parked("r1"), parked("r2")];
    const custom = { ...r2.agent, boundary: { cursor: 7, scratchpad: "opaque" } };
    await publish([await writeParticipant("environment", [r1.environment, r2.environment]), await writeParticipant("agent", [r1.agent, custom])]);
    const exported = await exportCheckpointSeeds(checkpointDir());
    expect(exported.seeds.map((s) => s.name)).toEqual([`continue:${ID}:r1`]);
    expect(exported.skipped).toMatchObject({ not_turn_loop: 1 });
  });

  it("skip a replayed episode parked before its first model call: its context is the replay seed, no progress of its own", async () => {
    // What the reference agent's boundary holds at turn 0 of a replayed (recheck) task: the system
    // prompt and the seed, whose assistant turns came from the source rollout, not from this episode.
    const seed = [
      { role: "user" as const, content: "Compute: 6*7" },
      { role: "assistant" as const, content: null, tool_calls: [{ id: "c1", type: "function" as const, function: { name: "calculator", arguments: "{}" } }] },
      { role: "tool" as const, tool_call_id: "c1", content: "42" },
      { role: "assistant" as const, content: "42" },
      { role: "user" as const, content: DEFAULT_RECHECK_PROMPT },
    ];
    const r1 = parked("r1");
    const agent = { ...r1.agent, boundary: seededState(seed) };
    await publish([await writeParticipant("environment", [r1.environment]), await writeParticipant("agent", [agent])]);
    const exported = await exportCheckpointSeeds(checkpointDir());
    // Its two assistant turns are the source rollout's: exported, it would be the replay task's own seed again.
    expect(exported.seeds.map((s) => s.lineage.turns)).toEqual([]);
    expect(exported.skipped).toMatchObject({ no_progress: 1 });
  });

  it("a replayed episode's seed carries the task it ran, matched by its replay run in the task file (a /replay/next reply)", async () => {
    // The replay task as /replay/next served it: the environment digests {task, replay_idx, replay_id}.
    const task = { expression: "6*7", tool_rounds: 2 };
    const seed = [
      { role: "user" as const, content: "Compute: 6*7" },
      { role: "assistant" as const, content: null, tool_calls: [{ id: "c1", type: "function" as const, function: { name: "calculator", arguments: "{}" } }] },
      { role: "tool" as const, tool_call_id: "c1", content: "42" },
    ];
    const served = { done: false, replay_idx: 3, replay_id: "b".repeat(64), name: "continue:aaaaaaaa:tool0", task, seed, lineage: { mode: "continue" } };
    const r1 = parked("r1");
    const start = seededState(seed);
    // One model turn of its own past the seed: a seed again, for a second-generation replay.
    const own = [{ role: "assistant", content: null, tool_calls: [{ id: "c2", type: "function", function: { name: "calculator", arguments: "{}" } }] }, { role: "tool", tool_call_id: "c2", content: "42" }];
    const environment = { ...r1.environment, task_digest: canonicalDigest({ task, replay_idx: served.replay_idx, replay_id: served.replay_id }) };
    const agent = { ...r1.agent, boundary: { ...start, messages: [...start.messages, ...own] } };
    await publish([await writeParticipant("environment", [environment]), await writeParticipant("agent", [agent])]);
    const file = path.join(root, "tasks.jsonl");
    await writeFile(file, `${JSON.stringify({ expression: "1+1" })}\n${JSON.stringify(served)}\n`);
    const exported = await exportCheckpointSeeds(checkpointDir(), { tasks: await readTaskFile(file) });
    expect(exported.seeds.map((s) => [s.name, s.task, s.lineage.turns])).toEqual([[`continue:${ID}:r1`, task, 2]]);
  });

  it("a seed's task keeps a __proto__ key as the task file wrote it, a plain task's and a replay run's alike", async () => {
    const plain = JSON.parse('{"__proto__":{"level":2},"expression":"6*7"}') as Record<string, unknown>;
    const replayed = JSON.parse('{"__proto__":[1],"expression":"2+2"}') as Record<string, unknown>;
    const run = { replay_idx: 1, replay_id: "c".repeat(64) };
    const [r1, r2] = [parked("r1"), parked("r2")];
    const environments = [
      { ...r1.environment, task_digest: canonicalDigest(plain) },
      { ...r2.environment, task_digest: canonicalDigest({ task: replayed, ...run }) },
    ];
    await publish([await writeParticipant("environment", environments), await writeParticipant("agent", [r1.agent, r2.agent])]);
    const file = path.join(root, "tasks.jsonl");
    await writeFile(file, `{"__proto__":{"level":2},"expression":"6*7"}\n{"done":false,"task":{"__proto__":[1],"expression":"2+2"},"replay_idx":1,"replay_id":"${run.replay_id}"}\n`);
    const exported = await exportCheckpointSeeds(checkpointDir(), { tasks: await readTaskFile(file) });
    expect(exported.seeds.map((seed) => JSON.stringify(seed.task))).toEqual(['{"__proto__":{"level":2},"expression":"6*7"}', '{"__proto__":[1],"expression":"2+2"}']);
  });

  it("one seed per boundary the agent waits for a model call at; every other boundary is skipped with its reason", async () => {
    const between = parked("between");
    const noBoundary = parked("no-boundary");
    const notStarted = parked("not-started");
    const atVerify = parked("at-verify");
    const atReturn = parked("at-return");
    const finished = parked("finished");
    const finalMessages = [...(finished.agent.boundary.messages as object[]), { role: "assistant", content: "42" }];
    // A restored record not yet re-dispatched is exported as its next attempt, the agent's session too.
    const restored = parked("restored");
    const next = { rollout_id: "restored", attempt: 1 };
    await publish([
      await writeParticipant("environment", [
        between.environment,
        { ...noBoundary.environment, boundary: null },
        notStarted.environment,
        { ...atVerify.environment, boundary: { next: "verify", answer: "42" } },
        { ...atReturn.environment, boundary: { next: "return", answer: "42", reward: 1 } },
        finished.environment,
        { ...restored.environment, episode_id: next },
      ]),
      await writeParticipant("agent", [
        between.agent,
        atVerify.agent,
        atReturn.agent,
        { ...finished.agent, boundary: { messages: finalMessages, answer: "42" } },
        { ...restored.agent, episode_id: next },
      ]),
    ]);
    const exported = await exportCheckpointSeeds(checkpointDir());
    expect(exported.seeds.map((s) => [s.name, s.lineage.attempt])).toEqual([
      [`continue:${ID}:between`, 0],
      [`continue:${ID}:restored-a1`, 1],
    ]);
    expect(exported.skipped).toEqual({ no_boundary: 1, not_started: 1, past_agent: 2, finished_loop: 1 });
  });

  it("refuse an episode two participants of one kind hold with different records, naming it and both participants", async () => {
    // Two environments both hold r1: one parked for the next model call, the other already at verify.
    // The later in the manifest won silently: the seed's existence depended on the manifest's order.
    for (const order of [0, 1]) {
      await rm(checkpointDir(), { recursive: true, force: true });
      const r1 = parked("r1");
      const atVerify = { ...r1.environment, boundary: { next: "verify", answer: "42" } };
      const environments = [await writeParticipant("environment", [r1.environment], "env-a"), await writeParticipant("environment", [atVerify], "env-b")];
      await publish([...(order ? environments.reverse() : environments), await writeParticipant("agent", [r1.agent])]);
      const error = await refusal(exportCheckpointSeeds(checkpointDir()));
      expect(error.code).toBe("invalid_checkpoint_state");
      expect(error.message).toMatch(/\br1\b/);
      expect(error.message).toContain("environment/env-a");
      expect(error.message).toContain("environment/env-b");
    }
    // So for agents: two sessions of r1 at different points of its conversation.
    await rm(checkpointDir(), { recursive: true, force: true });
    const r1 = parked("r1");
    const earlier = { ...r1.agent, boundary: { messages: (r1.agent.boundary.messages as object[]).slice(0, 2) } };
    await publish([
      await writeParticipant("environment", [r1.environment]),
      await writeParticipant("agent", [r1.agent], "agent-a"),
      await writeParticipant("agent", [earlier], "agent-b"),
    ]);
    const error = await refusal(exportCheckpointSeeds(checkpointDir()));
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringMatching(/agent\/agent-a.*agent\/agent-b/) });
  });

  it("refuse an episode one participant holds twice with different records", async () => {
    const r1 = parked("r1");
    await publish([
      await writeParticipant("environment", [r1.environment, { ...r1.environment, boundary: null }]),
      await writeParticipant("agent", [r1.agent]),
    ]);
    const error = await refusal(exportCheckpointSeeds(checkpointDir()));
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("episode r1 is held twice by environment/environment0") });
  });

  it("export an episode two participants hold with the same record once", async () => {
    const r1 = parked("r1");
    await publish([
      await writeParticipant("environment", [r1.environment], "env-a"),
      await writeParticipant("environment", [r1.environment], "env-b"),
      await writeParticipant("agent", [r1.agent], "agent-a"),
      await writeParticipant("agent", [r1.agent], "agent-b"),
    ]);
    const exported = await exportCheckpointSeeds(checkpointDir());
    expect(exported.seeds.map((s) => s.name)).toEqual([`continue:${ID}:r1`]);
    expect(exported.skipped).toEqual({});
  });

  it("refuse a participant directory replaced after publication, even a self-consistent one", async () => {
    const [r1, r2] = [parked("r1"), parked("r2")];
    await publish([await writeParticipant("environment", [r1.environment]), await writeParticipant("agent", [r1.agent])]);
    // Replace both with participants that are valid on their own but hold an episode never committed.
    for (const kind of ["environment", "agent"] as const) {
      await rm(participantDir({ checkpointDir: checkpointDir(), checkpointId: ID, kind, instance: `${kind}0` }), { recursive: true });
    }
    await writeParticipant("environment", [r1.environment, r2.environment]);
    await writeParticipant("agent", [r1.agent, r2.agent]);
    const replaced = await refusal(exportCheckpointSeeds(checkpointDir()));
    expect(replaced).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("checkpoint.json") });
  });

  it("refuse a manifest whose bytes differ from the committed ones though its records do not", async () => {
    const r1 = parked("r1");
    const env = await writeParticipant("environment", [r1.environment]);
    await publish([env, await writeParticipant("agent", [r1.agent])]);
    const file = path.join(checkpointDir(), env.manifest_path);
    const manifest = JSON.parse(await readFile(file, "utf8")) as Record<string, unknown>;
    const rewritten = JSON.stringify({ ...manifest, created_at: 2 });
    expect(sha256Hex(rewritten)).not.toBe(env.manifest_sha256);
    await rm(file);
    await writeFile(file, rewritten);
    const error = await refusal(exportCheckpointSeeds(checkpointDir()));
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("manifest digest") });
  });

  it("refuse a FIFO checkpoint.json at once instead of blocking on it", { timeout: 5000 }, async () => {
    await writeParticipant("agent", []);
    execFileSync("mkfifo", [path.join(checkpointDir(), GLOBAL_MANIFEST_FILE)]);
    const error = await refusal(exportCheckpointSeeds(checkpointDir()));
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });
    await rm(path.join(checkpointDir(), GLOBAL_MANIFEST_FILE));
    expect((await refusal(exportCheckpointSeeds(checkpointDir()))).code).toBe("invalid_request"); // not a published checkpoint
  });
});

describe("the --tasks file", () => {
  it("reads collect's {id, task} rows and bare tasks, and refuses a missing or malformed file with invalid_request", async () => {
    const file = path.join(root, "tasks.jsonl");
    await writeFile(file, '{"id":"r1","task":{"q":1}}\n\n{"q":2}\n');
    expect(await readTaskFile(file)).toEqual([{ q: 1 }, { q: 2 }]);
    const missing = await refusal(readTaskFile(path.join(root, "absent.jsonl")));
    expect(missing).toMatchObject({ code: "invalid_request", message: expect.stringContaining("does not exist") });
    await writeFile(file, '{"q":1}\nnot json\n');
    expect(await refusal(readTaskFile(file))).toMatchObject({ code: "invalid_request", message: expect.stringContaining("tasks.jsonl:2: not JSON") });
    expect((await refusal(readTaskFile(root))).code).toBe("invalid_request"); // a directory
  });

  it("reads a task file longer than any string, as collect does (it takes collect's task file)", { timeout: 60_000 }, async () => {
    const file = path.join(root, "tasks.jsonl");
    const blank = Buffer.from(" ".repeat(1 << 20) + "\n"); // blank lines, skipped
    const handle = await open(file, "w");
    try {
      for (let written = 0; written <= constants.MAX_STRING_LENGTH; written += blank.length) await handle.write(blank);
      await handle.write('{"id":"r1","task":{"q":1}}\n');
    } finally {
      await handle.close();
    }
    expect(await readTaskFile(file)).toEqual([{ q: 1 }]);
  });
});
