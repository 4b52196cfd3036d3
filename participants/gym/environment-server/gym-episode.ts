import type { Logger } from "pino";
import { z } from "zod";
import { CheckpointError, keepingProtoKey, rolloutPath } from "../../../protocol/index.js";
import type { StepEpisode } from "../../kinds/environment/index.js";
import { expectOk, isRefusal, postJson, trimSlash } from "../agent-server/gym-http.js";
import {
  CLOSE_SESSION_TIMEOUT_MS,
  closeResourcesSession,
  closeRestoredSession,
  retiredEpisode,
  seedSession,
  verifyAnswer,
  type OpenResourcesSession,
} from "../agent-server/resources-session.js";
import type { GymTask, RunReply } from "../agent-server/gym-task.js";
import { MAX_LOOP_MESSAGES } from "../agent-server/tool-calling-agent.js";

/**
 * The reference environment's episode protocol:
 *   seed (replay) → {next:"invoke_agent"} → agent activation (replay) → {next:"verify"} →
 *   verify (mode from the seed reply's x-ng-checkpoint-verify) → {next:"return"} → clean-up → reply.
 * After a crash the replacement attempt continues from the restored boundary.
 */
const VerifyModeSchema = z.enum(["wait", "replay"]);
/** The agent's conversation as its activation reports it (the episode's trajectory; kept in memory only). */
const MessagesSchema = z.array(keepingProtoKey(z.record(z.string(), z.unknown()))).max(MAX_LOOP_MESSAGES).optional();
export const EnvironmentBoundarySchema = z.discriminatedUnion("next", [
  z.object({ next: z.literal("invoke_agent"), cookie: z.string().nullable(), verify_mode: VerifyModeSchema }).strict(),
  z.object({ next: z.literal("verify"), cookie: z.string().nullable(), verify_mode: VerifyModeSchema, answer: z.string() }).strict(),
  // `cookie`: the verified session's, closed by an episode restored here (absent in older records).
  z.object({ next: z.literal("return"), cookie: z.string().nullable().optional(), answer: z.string(), reward: z.number() }).strict(),
]);
export type EnvironmentBoundary = z.infer<typeof EnvironmentBoundarySchema>;

/** A restored environment boundary, or `invalid_checkpoint_state` (checked before the restored record is taken). */
export function environmentBoundaryOf(key: string, restored: unknown): EnvironmentBoundary {
  const parsed = EnvironmentBoundarySchema.safeParse(restored);
  if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `the restored boundary of ${key} is not an environment boundary`);
  return parsed.data;
}

export interface GymEndpoints {
  agentUrl: string;
  resourcesUrl: string;
}

export interface GymEpisodeOptions {
  /** A replayed task: the context (chat messages, no system) the agent continues from. */
  seed?: Record<string, unknown>[];
  /**
   * A replayed task's sandbox setup (the replay source's): run first, in a replay step (none starts
   * while a checkpoint is open), before anything the episode opens; its failure fails the episode.
   * Not run again by an episode restored from a checkpoint: it continues from its boundary.
   */
  setup?: () => Promise<void>;
  /** Overrides CLOSE_SESSION_TIMEOUT_MS (tests). */
  closeSessionTimeoutMs?: number;
  /** Where a failed clean-up of the resources session is reported. */
  logger?: Logger | undefined;
}

/** The `/run` reply plus the agent's conversation (absent when the agent did not report one). */
export interface GymEpisodeResult extends RunReply {
  messages?: Record<string, unknown>[];
}

export async function runGymEpisode(endpoints: GymEndpoints, ep: StepEpisode, task: GymTask, options: GymEpisodeOptions = {}): Promise<GymEpisodeResult> {
  const open: OpenResourcesSession = {};
  const setup = options.setup;
  const restored = ep.continuation();
  // Once per episode, when it starts from its input, as its seed: a restored episode continues past
  // it, and what the setup made is the checkpointed run's (set up again, a sandbox would be reset
  // under the restored conversation). Nothing is open yet: a failed setup has nothing to clean up.
  if (setup && !restored) await ep.step("replay", () => setup());
  try {
    return await runSteps(endpoints, ep, task, options, open, restored);
  } catch (error) {
    // A failed episode (deadline, callee error) must not leave an activation running at the agent,
    // nor its session at the resources server. A retired one is freed there by the retire itself.
    if (!retiredEpisode(ep)) {
      await Promise.all([
        closeAgentSession(endpoints, ep, options),
        open.session && closeResourcesSession(ep, trimSlash(endpoints.resourcesUrl), open.session, { timeoutMs: options.closeSessionTimeoutMs, logger: options.logger }),
      ]);
    }
    throw error;
  }
}

/** Best-effort `close_session`: failures and timeouts are ignored. */
async function closeAgentSession(endpoints: GymEndpoints, ep: StepEpisode, options: GymEpisodeOptions): Promise<void> {
  const signal = AbortSignal.timeout(options.closeSessionTimeoutMs ?? CLOSE_SESSION_TIMEOUT_MS);
  await postJson(`${trimSlash(endpoints.agentUrl)}${rolloutPath(ep.key, "/close_session")}`, {}, { signal }).catch(() => undefined);
}

async function runSteps(
  endpoints: GymEndpoints,
  ep: StepEpisode,
  task: GymTask,
  options: GymEpisodeOptions,
  open: OpenResourcesSession,
  restored: Record<string, unknown> | null,
): Promise<GymEpisodeResult> {
  const agent = trimSlash(endpoints.agentUrl);
  const resources = trimSlash(endpoints.resourcesUrl);
  let boundary = restored ? environmentBoundaryOf(ep.key, restored) : undefined;
  const continuedFrom = boundary?.next ?? null;
  // Not part of any boundary: an episode restored past the agent replies without a trajectory.
  let messages: Record<string, unknown>[] | undefined;

  if (!boundary) {
    open.session = await seedSession(ep, resources, task, open);
    boundary = { next: "invoke_agent", ...open.session };
    await ep.boundary(boundary);
  } else if (boundary.next !== "return") {
    open.session = { cookie: boundary.cookie, verify_mode: boundary.verify_mode };
  }

  if (boundary.next === "invoke_agent") {
    const { cookie, verify_mode } = boundary;
    // Agent activations continue from the agent's own boundaries, so the step may be replayed.
    let answer: string | undefined;
    while (answer === undefined) {
      try {
        ({ answer, messages } = await ep.step("replay", async (signal) => {
          expectOk("open_session", await postJson(`${agent}${rolloutPath(ep.key, "/open_session")}`, { cookie }, { signal }));
          const body = { task, ...(options.seed && { seed: options.seed }) };
          const activated = expectOk("activate", await postJson(`${agent}${rolloutPath(ep.key, "/activate")}`, body, { signal }));
          return z.object({ answer: z.string(), messages: MessagesSchema }).passthrough().parse(activated);
        }));
      } catch (error) {
        // The agent closed admission after this step started: park at invoke_agent, retry after resume.
        if (!isRefusal(error, "admission_closed")) throw error;
        await ep.park();
      }
    }
    boundary = { next: "verify", cookie, verify_mode, answer };
    await ep.boundary(boundary);
  }

  if (boundary.next === "verify") {
    const { cookie, answer, verify_mode } = boundary;
    const reward = await verifyAnswer(ep, resources, task, { cookie, verify_mode }, answer);
    open.session = undefined; // ended by its verify
    boundary = { next: "return", cookie, answer, reward };
    // An episode finishing while Gym is prepared waits here without delivering its result.
    await ep.boundary(boundary);
  } else if (boundary.cookie) {
    // Restored past its verify: the checkpoint may hold the verified session too, restored with it.
    await closeRestoredSession(ep, resources, boundary.cookie, options.logger);
  }

  const done = boundary;
  await ep.finishing(async () => {
    // Final clean-up is never interrupted by retire (only bounded by its own timeout); failures here do not change the result.
    await closeAgentSession(endpoints, ep, options);
  });
  const reply = { rollout_id: ep.id.rollout_id, attempt: ep.id.attempt, reward: done.reward, answer: done.answer, continued_from: continuedFrom };
  return messages ? { ...reply, messages } : reply;
}
