import path from "node:path";
import { z } from "zod";
import {
  keepingProtoKey,
  CheckpointError,
  GLOBAL_MANIFEST_FILE,
  GlobalManifestSchema,
  schemaVersionMismatch,
  MAX_GLOBAL_MANIFEST_BYTES,
  canonicalDigest,
  canonicalJson,
  captureKey,
  describeZodError,
  jsonNestsDeeperThan,
  type GlobalManifest,
  type RecordBase,
} from "../../protocol/index.js";
import { AgentRecordSchema, LegacySessionSchema, type AgentRecord } from "../kinds/agent/index.js";
import { EnvironmentRecordSchema, type EnvironmentRecord } from "../kinds/environment/index.js";
import { FsCheckpointStorage } from "../storage/fs-storage.js";
import { readRegularFile } from "../storage/regular-file.js";
import { estimateTokens, isResumePoint, seededContextNodes } from "./anchors.js";
import { ChatMessageLikeSchema, chatToMessage } from "./chat-trajectory.js";
import { invalidRequest, invalidState } from "./errors.js";
import { replayRunDigestInput } from "./replay-run-digest.js";
import { PromptSchema, type Message } from "./trace-record.js";

/**
 * A published checkpoint's parked episodes as `continue` seeds: each episode parked where the
 * agent waits for its next model call becomes a fresh task whose prompt is the conversation so far
 * (system message dropped; the harness adds its own). Lineage names the checkpoint, the episode's
 * capture key and the boundary, so the seed can always be traced back to the exact records.
 */
export const CheckpointSeedSchema = z
  .object({
    name: z.string().min(1),
    prompt: PromptSchema,
    /**
     * The original task when it was given (matched by the records' task digest), else null. A
     * replayed episode's is the task its replay run carried, when that run was given.
     */
    task: keepingProtoKey(z.record(z.string(), z.unknown())).nullable(),
    seed_tokens: z.number().int().min(0),
    lineage: z
      .object({
        mode: z.literal("continue"),
        anchor: z.literal("checkpoint-boundary"),
        source_checkpoint_id: z.string(),
        capture_key: z.string(),
        rollout_id: z.string(),
        attempt: z.number().int().min(0),
        /** The boundary the episode was parked at: `invoke_agent` (native) or `loop` (legacy agent `/run`). */
        boundary: z.string(),
        task_digest: z.string().nullable(),
        /** Model turns already in the seeded context. */
        turns: z.number().int().min(0),
      })
      .strict(),
  })
  .strict();
export type CheckpointSeed = z.infer<typeof CheckpointSeedSchema>;

export type CheckpointSeedSkip = "no_boundary" | "past_agent" | "not_started" | "not_turn_loop" | "finished_loop" | "no_progress" | "not_a_resume_point" | "restart";

export interface CheckpointSeedExport {
  checkpointId: string;
  seeds: CheckpointSeed[];
  skipped: Partial<Record<CheckpointSeedSkip, number>>;
}

const LoopSnapshotSchema = z
  .object({ messages: z.array(ChatMessageLikeSchema).min(1), answer: z.string().optional(), seeded: z.number().int().nonnegative().optional() })
  .passthrough();
/** A replayed run in a task file: a `/replay/next` reply or the `/run` body it became. */
// Tasks keep a `__proto__` key (zod's record would leave it out): the digest and the seed are the task's as written.
const ReplayRunRowSchema = z.looseObject({ task: keepingProtoKey(z.record(z.string(), z.unknown())), replay_idx: z.number().int().min(0), replay_id: z.string() });

const LegacyLoopSchema = z.object({ next: z.literal("loop"), state: LoopSnapshotSchema }).passthrough();

async function readGlobalManifest(checkpointDir: string): Promise<GlobalManifest> {
  const file = path.join(checkpointDir, GLOBAL_MANIFEST_FILE);
  let text: string;
  try {
    // Never a FIFO or device (it would block or stream forever), never past the limit.
    text = (await readRegularFile(file, { maxBytes: MAX_GLOBAL_MANIFEST_BYTES })).toString("utf8");
  } catch (error) {
    if (error instanceof CheckpointError) throw invalidState(error.message);
    // Absent (or the path runs through a file): not a published checkpoint, a bad --checkpoint. Any
    // other refusal (EIO, EACCES, a stale NFS handle) is the storage's, storage_error to the caller.
    const code = (error as NodeJS.ErrnoException).code;
    if (code !== "ENOENT" && code !== "ENOTDIR") throw error;
    throw invalidRequest(`${checkpointDir} holds no ${GLOBAL_MANIFEST_FILE} (not a published checkpoint)`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw invalidState(`${file} is not JSON`);
  }
  const otherVersion = schemaVersionMismatch(raw, file);
  if (otherVersion) throw invalidState(otherVersion);
  const parsed = GlobalManifestSchema.safeParse(raw);
  if (!parsed.success) throw invalidState(`${file} is invalid: ${describeZodError(parsed.error)}`);
  return parsed.data;
}

interface Held<R> {
  record: R;
  from: string;
}

/**
 * One record per episode and kind. Another copy of the same record (equal canonical JSON: the same
 * participant listed twice, say) is taken once; any other contradicts it, and which one a seed came
 * from would depend on the manifest's order, so it is refused. Compared only on a collision (a
 * boundary nested past canonical JSON's depth cannot be compared: refused too).
 */
function holdOnce<R extends RecordBase>(held: Map<string, Held<R>>, record: R, from: string): void {
  const key = captureKey(record.episode_id);
  const first = held.get(key);
  if (!first) return void held.set(key, { record, from });
  const same = !jsonNestsDeeperThan(first.record) && !jsonNestsDeeperThan(record) && canonicalJson(first.record) === canonicalJson(record);
  const holders = first.from === from ? `twice by ${from}` : `by ${first.from} and by ${from}`;
  if (!same) throw invalidState(`episode ${key} is held ${holders}, and their records differ: the checkpoint contradicts itself`);
}

/** The storage refuses with CheckpointErrors; replay refusals are ReplayErrors with the same code. */
async function readParticipant<T>(read: Promise<T>): Promise<T> {
  try {
    return await read;
  } catch (error) {
    if (error instanceof CheckpointError && error.code === "invalid_checkpoint_state") throw invalidState(error.message, { cause: error });
    throw error;
  }
}

/**
 * Reads `checkpoint.json`, then every environment and agent participant's records (manifest
 * identity, digest and count verified by the storage, the manifest against the digests and count
 * checkpoint.json pins), and exports the resumable episodes.
 * `tasks` (e.g. the collection's task file) lets a seed carry its original task, matched by digest;
 * a replayed episode's, by its replay run (a `/replay/next` reply or its `/run` body) among them.
 */
export async function exportCheckpointSeeds(checkpointDir: string, options: { tasks?: readonly unknown[] } = {}): Promise<CheckpointSeedExport> {
  const manifest = await readGlobalManifest(checkpointDir);
  const id = manifest.checkpoint_id;
  const storage = new FsCheckpointStorage();
  const environments = new Map<string, Held<EnvironmentRecord>>();
  const agents = new Map<string, Held<AgentRecord>>();
  for (const p of manifest.participants) {
    const target = { checkpointDir, checkpointId: id, kind: p.kind, instance: p.instance };
    const from = `${p.kind}/${p.instance}`;
    // Pinned to checkpoint.json's entry: a participant directory replaced after publication (even a
    // self-consistent one) holds episodes that were never committed, and is refused before it is read.
    if (p.kind === "environment") {
      for (const r of (await readParticipant(storage.read(target, EnvironmentRecordSchema, undefined, p))).records) holdOnce(environments, r, from);
    } else if (p.kind === "agent") {
      for (const r of (await readParticipant(storage.read(target, AgentRecordSchema, undefined, p))).records) holdOnce(agents, r, from);
    }
  }
  const environment = new Map([...environments].map(([key, held]) => [key, held.record]));
  const agent = new Map([...agents].map(([key, held]) => [key, held.record]));
  const byDigest = new Map<string, Record<string, unknown>>();
  for (const task of options.tasks ?? []) {
    if (task !== null && typeof task === "object" && !Array.isArray(task)) byDigest.set(canonicalDigest(task), task as Record<string, unknown>);
    // A replayed episode's digest covers its replay task too: only its replay run names that, and
    // the seed carries the task the run did (else a replay of the seed would have no task).
    const run = ReplayRunRowSchema.safeParse(task);
    if (run.success) byDigest.set(canonicalDigest(replayRunDigestInput(run.data.task, run.data)), run.data.task);
  }
  const restarts = new Set(manifest.restarts);
  const skipped: CheckpointSeedExport["skipped"] = {};
  const skip = (reason: CheckpointSeedSkip) => void (skipped[reason] = (skipped[reason] ?? 0) + 1);
  const seeds: CheckpointSeed[] = [];

  const keys = [...new Set([...environment.keys(), ...[...agent.values()].filter((a) => a.mode === "legacy").map((a) => captureKey(a.episode_id))])].sort();
  for (const key of keys) {
    if (restarts.has(key)) {
      skip("restart");
      continue;
    }
    const env = environment.get(key);
    const ag = agent.get(key);
    let boundary: string;
    let snapshot: unknown;
    let digest: string | null;
    if (env) {
      digest = env.task_digest;
      if (env.boundary === null) {
        skip("no_boundary");
        continue;
      }
      boundary = String(env.boundary["next"]);
      if (boundary !== "invoke_agent") {
        skip("past_agent"); // verify/return: the conversation is over, nothing to continue
        continue;
      }
      if (!ag || ag.mode !== "session" || ag.boundary === null) {
        skip("not_started");
        continue;
      }
      snapshot = ag.boundary;
    } else {
      const legacy = LegacyLoopSchema.safeParse(ag!.episode);
      const session = LegacySessionSchema.safeParse(ag!.session);
      digest = session.success ? session.data.task_digest : null;
      if (!legacy.success) {
        skip(ag!.episode === null ? "no_boundary" : "past_agent");
        continue;
      }
      boundary = "loop";
      snapshot = legacy.data.state;
    }
    const loop = LoopSnapshotSchema.safeParse(snapshot);
    if (!loop.success) {
      // Another agent's own boundary state (the agent SDK's is opaque): no chat seed derives from it.
      skip("not_turn_loop");
      continue;
    }
    if (loop.data.answer !== undefined) {
      skip("finished_loop");
      continue;
    }
    const messages: Message[] = loop.data.messages.map(chatToMessage);
    const context = messages[0]?.role === "system" ? messages.slice(1) : messages;
    const turns = context.filter((m) => m.role === "assistant").length;
    // A replayed task's seeded turns are its source rollout's: without turns of its own, the seed
    // would be the replay task's own prompt again.
    const ownTurns = messages.slice(loop.data.seeded ?? 0).filter((m) => m.role === "assistant").length;
    if (ownTurns === 0) {
      skip("no_progress"); // the seed would be the task's own prompt
      continue;
    }
    if (!isResumePoint(context)) {
      skip("not_a_resume_point");
      continue;
    }
    const episode = (env ?? ag)!.episode_id;
    seeds.push(
      CheckpointSeedSchema.parse({
        name: `continue:${id}:${key}`,
        prompt: context,
        task: digest ? (byDigest.get(digest) ?? null) : null,
        seed_tokens: estimateTokens(seededContextNodes(context)),
        lineage: {
          mode: "continue",
          anchor: "checkpoint-boundary",
          source_checkpoint_id: id,
          capture_key: key,
          rollout_id: episode.rollout_id,
          attempt: episode.attempt,
          boundary,
          task_digest: digest,
          turns,
        },
      }),
    );
  }
  return { checkpointId: id, seeds, skipped };
}
