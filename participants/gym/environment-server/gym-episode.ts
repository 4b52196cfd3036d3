import { z } from "zod";
import { CheckpointError, rolloutPath } from "../../../protocol/index.js";
import type { StepEpisode } from "../../kinds/environment/index.js";
import { expectOk, isRefusal, postJson, trimSlash } from "../agent-server/gym-http.js";
import { seedSession } from "../agent-server/seed-session.js";
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
const MessagesSchema = z.array(z.record(z.string(), z.unknown())).max(MAX_LOOP_MESSAGES).optional();
export const EnvironmentBoundarySchema = z.discriminatedUnion("next", [
  z.object({ next: z.literal("invoke_agent"), cookie: z.string().nullable(), verify_mode: VerifyModeSchema }).strict(),
  z.object({ next: z.literal("verify"), cookie: z.string().nullable(), verify_mode: VerifyModeSchema, answer: z.string() }).strict(),
  z.object({ next: z.literal("return"), answer: z.string(), reward: z.number() }).strict(),
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

/**
 * How long the agent's `close_session` clean-up may take. Its failure is ignored anyway, and an
 * episode in final clean-up is not interrupted by retire, so a hung agent must not keep it (a
 * blocker) alive until the episode deadline.
 */
export const CLOSE_SESSION_TIMEOUT_MS = 5000;

export interface GymEpisodeOptions {
  /** A replayed task: the context (chat messages, no system) the agent continues from. */
  seed?: Record<string, unknown>[];
  /** Overrides CLOSE_SESSION_TIMEOUT_MS (tests). */
  closeSessionTimeoutMs?: number;
}

/** The `/run` reply plus the agent's conversation (absent when the agent did not report one). */
export interface GymEpisodeResult extends RunReply {
  messages?: Record<string, unknown>[];
}

function cookieHeader(cookie: string | null): Record<string, string> {
  return cookie ? { cookie: `ng_session=${cookie}` } : {};
}

export async function runGymEpisode(endpoints: GymEndpoints, ep: StepEpisode, task: GymTask, options: GymEpisodeOptions = {}): Promise<GymEpisodeResult> {
  try {
    return await runSteps(endpoints, ep, task, options);
  } catch (error) {
    // A failed episode (deadline, callee error) must not leave an activation running at the agent.
    if (!ep.signal.aborted || !isRefusal(ep.signal.reason, "stale_attempt")) await closeAgentSession(endpoints, ep, options);
    throw error;
  }
}

/** Best-effort `close_session`: failures and timeouts are ignored. */
async function closeAgentSession(endpoints: GymEndpoints, ep: StepEpisode, options: GymEpisodeOptions): Promise<void> {
  const signal = AbortSignal.timeout(options.closeSessionTimeoutMs ?? CLOSE_SESSION_TIMEOUT_MS);
  await postJson(`${trimSlash(endpoints.agentUrl)}${rolloutPath(ep.key, "/close_session")}`, {}, { signal }).catch(() => undefined);
}

async function runSteps(endpoints: GymEndpoints, ep: StepEpisode, task: GymTask, options: GymEpisodeOptions): Promise<GymEpisodeResult> {
  const agent = trimSlash(endpoints.agentUrl);
  const resources = trimSlash(endpoints.resourcesUrl);
  const restored = ep.continuation();
  let boundary = restored ? environmentBoundaryOf(ep.key, restored) : undefined;
  const continuedFrom = boundary?.next ?? null;
  // Not part of any boundary: an episode restored past the agent replies without a trajectory.
  let messages: Record<string, unknown>[] | undefined;

  if (!boundary) {
    const seeded = await seedSession(ep, resources, task);
    boundary = { next: "invoke_agent", cookie: seeded.cookie, verify_mode: seeded.verify_mode };
    await ep.boundary(boundary);
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
    let reward: number | undefined;
    while (reward === undefined) {
      try {
        reward = await ep.step(verify_mode, async (signal) => {
          const response = await postJson(`${resources}${rolloutPath(ep.key, "/verify")}`, { task, answer }, { signal, headers: cookieHeader(cookie) });
          return z.object({ reward: z.number() }).passthrough().parse(expectOk("verify", response)).reward;
        });
      } catch (error) {
        // Refused before it ran (the resources server closed admission): park at verify and retry
        // after resume. Passed on, /run would answer admission_closed for an episode that already
        // ran its agent, and the caller would send the same attempt again from its input.
        if (!isRefusal(error, "admission_closed")) throw error;
        await ep.park();
      }
    }
    boundary = { next: "return", answer, reward };
    // An episode finishing while Gym is prepared waits here without delivering its result.
    await ep.boundary(boundary);
  }

  const done = boundary;
  await ep.finishing(async () => {
    // Final clean-up is never interrupted by retire (only bounded by its own timeout); failures here do not change the result.
    await closeAgentSession(endpoints, ep, options);
  });
  const reply = { rollout_id: ep.id.rollout_id, attempt: ep.id.attempt, reward: done.reward, answer: done.answer, continued_from: continuedFrom };
  return messages ? { ...reply, messages } : reply;
}
