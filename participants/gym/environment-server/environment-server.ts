import Fastify, { type FastifyInstance } from "fastify";
import type { Logger } from "pino";
import { z } from "zod";
import { CheckpointError, TRAJECTORY_HEADER, canonicalDigest, captureKey, describeZodError } from "../../../protocol/index.js";
import { sendRefusal } from "../../http/http-refusal.js";
import { installJsonBodyParser } from "../../http/json-body.js";
import { installRefusalHandlers, participantServerOptions } from "../../http/refusal-handlers.js";
import type { EnvironmentKind } from "../../kinds/environment/index.js";
import { ChatMessageLikeSchema, chatTrajectory } from "../../replay/chat-trajectory.js";
import { ReplayError } from "../../replay/errors.js";
import { gymReplayRun, type GymRecordTask, type GymReplayRun, type GymReplaySource } from "../../replay/gym-replay-source.js";
import { replayRunDigestInput } from "../../replay/replay-run-digest.js";
import type { ReplayTask } from "../../replay/replay-task-source.js";
import { dependencyFailure } from "../agent-server/gym-http.js";
import { RunRequestSchema, taskSpellings } from "../agent-server/gym-task.js";
import { MAX_SEED_BYTES, MAX_SEED_MESSAGES } from "../agent-server/tool-calling-agent.js";
import { environmentBoundaryOf, runGymEpisode, type GymEndpoints } from "./gym-episode.js";

/**
 * `/run` also takes `replay_idx` with `replay_id`: the task at that index of the served replay
 * source, which must have that content id (see docs/replay.md).
 */
const EnvironmentRunSchema = RunRequestSchema.extend({
  replay_idx: z.number().int().min(0).optional(),
  replay_id: z.string().regex(/^[0-9a-f]{64}$/).optional(),
})
  .strict()
  .refine((body) => (body.replay_idx === undefined) === (body.replay_id === undefined), { message: "replay_idx and replay_id go together" });

/**
 * The reference environment server: `POST /run {rollout_id, attempt, task}` → seed → agent →
 * verify → `{rollout_id, attempt, reward, answer, continued_from}`. Refusals carry catalog codes:
 * `admission_closed` while a checkpoint is open, `stale_attempt` for retired or conflicting
 * attempts, `invalid_request` for a task that differs from the restored one, `invalid_checkpoint_state`
 * for a restored boundary that is not an environment boundary (the restored record is kept);
 * `upstream_failed` when a callee refused one of the episode's calls (its code in the detail).
 * With `x-ng-trajectory: 1` the reply also carries `trajectory` (the conversation as a rollout
 * record's message graph, reward, turns); with a replay source, `/replay/next` hands out replayed
 * tasks and `/run {…, replay_idx}` runs one from its seeded context (docs/replay.md).
 */
export interface EnvironmentAppOptions {
  kind: EnvironmentKind;
  endpoints: GymEndpoints;
  episodeTimeoutMs?: number;
  /** A replay task source served at `/replay/*`; `/run` then accepts `replay_idx`. */
  replay?: GymReplaySource;
  /** Overrides MAX_SEED_BYTES, the largest replay seed `/run` runs (tests). */
  maxSeedBytes?: number;
  logger?: Logger;
}

/**
 * Why `/run` would refuse replay task `task` before running anything, undefined when it runs: a
 * seed longer or larger than the agent takes (it would refuse only at activate, after the session
 * was seeded; a seed carrying a reasoning model's turns can be large), or a sandbox snapshot the
 * source cannot restore (the reference Gym restores none).
 */
function unrunnable(replay: GymReplaySource, task: ReplayTask<GymRecordTask>, seed: readonly unknown[], maxSeedBytes: number): string | undefined {
  if (seed.length > MAX_SEED_MESSAGES) return `replay task ${task.idx}'s seed has ${seed.length} messages; the agent takes at most ${MAX_SEED_MESSAGES}`;
  const bytes = Buffer.byteLength(JSON.stringify(seed));
  if (bytes > maxSeedBytes) return `replay task ${task.idx}'s seed is ${bytes} bytes as JSON; the agent takes at most ${maxSeedBytes}`;
  return replay.setupRefusal(task);
}

/** A replay refusal keeps its catalog code on the wire (a corrupt record file is invalid_checkpoint_state, not internal_error). */
function replayRefusal(error: unknown): unknown {
  return error instanceof ReplayError ? new CheckpointError(error.code, error.message, { cause: error }) : error;
}

export function createEnvironmentApp(options: EnvironmentAppOptions): FastifyInstance {
  const { kind, endpoints } = options;
  const app = Fastify({ logger: false, bodyLimit: 1 << 20, ...participantServerOptions(kind.kind) });
  installJsonBodyParser(app);
  const logger = options.logger;
  installRefusalHandlers(app, "environment server", kind.kind, logger);
  app.get("/health", async () => ({ ok: true }));
  app.get("/admin/state", async () => ({ ...kind.statusExtras(), states: kind.episodes.steps.states() }));
  const replay = options.replay;
  const maxSeedBytes = options.maxSeedBytes ?? MAX_SEED_BYTES;
  /** Replay tasks /replay/next passed over because /run would refuse them. */
  let unrunnableSkipped = 0;
  if (replay) {
    // Every info request reloads first (one reload at a time), so a poller sees the tasks on disk now.
    app.get("/replay/info", async (_request, reply) => {
      try {
        await replay.reload();
      } catch (error) {
        return sendRefusal(reply, replayRefusal(error), kind.kind, logger);
      }
      return { tasks: replay.size, num_tasks: replay.size, unrunnable: unrunnableSkipped, config: replay.config, stats: replay.stats };
    });
    // The next unserved replay task (reloading first when the list ran dry): a ready /run body minus
    // the ids. Tasks /run would refuse are passed over (counted, logged), not removed: every worker
    // keeps the same indices.
    app.post("/replay/next", async (_request, reply) => {
      try {
        for (let task = await replay.next(); task; task = await replay.next()) {
          const run = gymReplayRun(task);
          const refusal = unrunnable(replay, task, run.seed, maxSeedBytes);
          if (!refusal) return { done: false, ...run };
          unrunnableSkipped += 1;
          logger?.warn({ replay_idx: task.idx, replay_id: run.replay_id, reason: refusal }, "replay task passed over: /run would refuse it");
        }
      } catch (error) {
        return sendRefusal(reply, replayRefusal(error), kind.kind, logger);
      }
      return { done: true, tasks: replay.size, unrunnable: unrunnableSkipped };
    });
  }
  app.post("/run", async (request, reply) => {
    try {
      const parsed = EnvironmentRunSchema.safeParse(request.body ?? {});
      if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
      const body = parsed.data;
      const episode = { rollout_id: body.rollout_id, attempt: body.attempt };
      let replayed: GymReplayRun | undefined;
      let setup: (() => Promise<void>) | undefined;
      if (body.replay_idx !== undefined) {
        if (!replay) throw new CheckpointError("invalid_request", "this environment serves no replay source (start it with --replay-config)");
        // An unknown index is the caller's invalid_request; a reload that found corrupt records is not.
        const replayTask = await replay.taskAt(body.replay_idx).catch((error: unknown) => {
          throw replayRefusal(error);
        });
        replayed = gymReplayRun(replayTask);
        // The index alone could name another task on a worker whose list differs: the id must match too.
        if (replayed.replay_id !== body.replay_id) {
          throw new CheckpointError("invalid_request", `replay task ${body.replay_idx} has id ${replayed.replay_id}, not ${body.replay_id}`);
        }
        if (canonicalDigest(replayed.task) !== canonicalDigest(body.task)) {
          throw new CheckpointError("invalid_request", `task differs from replay task ${body.replay_idx}'s`);
        }
        const refusal = unrunnable(replay, replayTask, replayed.seed, maxSeedBytes);
        if (refusal) throw new CheckpointError("invalid_request", refusal);
        // A seed anchored at a sandbox snapshot continues only from that snapshot, which the source's
        // setup restores: inside the episode, after begin's attempt and admission checks, so a
        // refused /run has not touched the source's sandbox.
        setup = () =>
          replay.setup(replayTask).catch((error: unknown) => {
            throw replayRefusal(error);
          });
      }
      // The digest is of the task as the caller spelled it, not as parsed (defaults filled in), so a
      // checkpoint seed finds it in the caller's task file. A replayed run is a different episode
      // input than its plain task: the restore digest says so, and names the replay task by content
      // (every anchor of one record shares the task).
      const sent = (request.body as { task: unknown }).task;
      const digestOf = (task: unknown) => (replayed ? replayRunDigestInput(task, replayed) : task);
      const digested = digestOf(sent);
      const begin = {
        checkBoundary: (boundary: unknown) => void environmentBoundaryOf(captureKey(episode), boundary),
        // A record digested from another spelling (defaults filled in: checkpoints of older servers) is the same task.
        sameTask: taskSpellings(body.task).map(digestOf),
        ...(options.episodeTimeoutMs !== undefined && { timeoutMs: options.episodeTimeoutMs }),
      };
      const result = await kind.begin(episode, digested, begin, (ep) => runGymEpisode(endpoints, ep, body.task, { logger, ...(replayed && { seed: replayed.seed }), ...(setup && { setup }) }));
      const { messages, ...runReply } = result;
      if (request.headers[TRAJECTORY_HEADER] !== "1") return runReply;
      // Opt-in: the episode as a rollout record's message graph (collectors write it as records).
      // Unknown after a restore past the agent (the boundaries do not keep it): trajectory null.
      const chat = z.array(ChatMessageLikeSchema).min(1).safeParse(messages);
      if (!chat.success) return { ...runReply, trajectory: null };
      const conversation = chat.data;
      const firstUser = conversation.find((m) => m.role === "user")?.content ?? null;
      const trajectory = chatTrajectory({
        messages: conversation,
        seeded: 1 + (replayed ? replayed.seed.length : 1),
        reward: runReply.reward,
        taskName: replayed ? replayed.name : null,
        prompt: replayed ? (replay!.tasks[replayed.replay_idx]!.prompt) : firstUser,
        replay: replayed ? { ...replayed.lineage } : null,
      });
      return { ...runReply, trajectory };
    } catch (error) {
      return sendRefusal(reply, dependencyFailure(error), kind.kind, logger);
    }
  });
  return app;
}
