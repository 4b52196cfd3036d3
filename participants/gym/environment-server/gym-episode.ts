import { z } from "zod";
import { CheckpointError, rolloutPath } from "../../../protocol/index.js";
import type { StepEpisode, StepMode } from "../../kinds/environment/index.js";
import { expectOk, isRefusal, postJson, sessionCookieFrom, trimSlash } from "../agent-server/gym-http.js";
import type { GymTask, RunReply } from "../agent-server/gym-task.js";

/**
 * The reference environment's episode protocol:
 *   seed (replay) → {next:"invoke_agent"} → agent activation (replay) → {next:"verify"} →
 *   verify (mode from the seed reply's x-ng-checkpoint-verify) → {next:"return"} → clean-up → reply.
 * After a crash the replacement attempt continues from the restored boundary.
 */
const VerifyModeSchema = z.enum(["wait", "replay"]);
export const EnvironmentBoundarySchema = z.discriminatedUnion("next", [
  z.object({ next: z.literal("invoke_agent"), cookie: z.string().nullable(), verify_mode: VerifyModeSchema }).strict(),
  z.object({ next: z.literal("verify"), cookie: z.string().nullable(), verify_mode: VerifyModeSchema, answer: z.string() }).strict(),
  z.object({ next: z.literal("return"), answer: z.string(), reward: z.number() }).strict(),
]);
export type EnvironmentBoundary = z.infer<typeof EnvironmentBoundarySchema>;

export interface GymEndpoints {
  agentUrl: string;
  resourcesUrl: string;
}

function cookieHeader(cookie: string | null): Record<string, string> {
  return cookie ? { cookie: `ng_session=${cookie}` } : {};
}

export async function runGymEpisode(endpoints: GymEndpoints, ep: StepEpisode, task: GymTask): Promise<RunReply> {
  try {
    return await runSteps(endpoints, ep, task);
  } catch (error) {
    // A failed episode (deadline, callee error) must not leave an activation running at the agent.
    if (!ep.signal.aborted || !isRefusal(ep.signal.reason, "stale_attempt")) {
      await postJson(`${trimSlash(endpoints.agentUrl)}${rolloutPath(ep.key, "/close_session")}`, {}).catch(() => undefined);
    }
    throw error;
  }
}

async function runSteps(endpoints: GymEndpoints, ep: StepEpisode, task: GymTask): Promise<RunReply> {
  const agent = trimSlash(endpoints.agentUrl);
  const resources = trimSlash(endpoints.resourcesUrl);
  const restored = ep.continuation();
  let boundary: EnvironmentBoundary | undefined;
  if (restored) {
    const parsed = EnvironmentBoundarySchema.safeParse(restored);
    if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `the restored boundary of ${ep.key} is not an environment boundary`);
    boundary = parsed.data;
  }
  const continuedFrom = boundary?.next ?? null;

  if (!boundary) {
    const seeded = await ep.step("replay", async (signal) => {
      const response = await postJson(`${resources}${rolloutPath(ep.key, "/seed_session")}`, { task }, { signal });
      expectOk("seed_session", response);
      return {
        cookie: sessionCookieFrom(response.headers) ?? null,
        verify: (response.headers.get("x-ng-checkpoint-verify") === "replay" ? "replay" : "wait") as StepMode,
        restart: response.headers.get("x-ng-checkpoint-restart") === "1",
      };
    });
    if (seeded.restart) await ep.markRestart();
    boundary = { next: "invoke_agent", cookie: seeded.cookie, verify_mode: seeded.verify };
    await ep.boundary(boundary);
  }

  if (boundary.next === "invoke_agent") {
    const { cookie, verify_mode } = boundary;
    // Agent activations continue from the agent's own boundaries, so the step may be replayed.
    let answer: string | undefined;
    while (answer === undefined) {
      try {
        answer = await ep.step("replay", async (signal) => {
          expectOk("open_session", await postJson(`${agent}${rolloutPath(ep.key, "/open_session")}`, { cookie }, { signal }));
          const activated = expectOk("activate", await postJson(`${agent}${rolloutPath(ep.key, "/activate")}`, { task }, { signal }));
          return z.object({ answer: z.string() }).passthrough().parse(activated).answer;
        });
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
    const { cookie, answer } = boundary;
    const reward = await ep.step(boundary.verify_mode, async (signal) => {
      const response = await postJson(`${resources}${rolloutPath(ep.key, "/verify")}`, { task, answer }, { signal, headers: cookieHeader(cookie) });
      return z.object({ reward: z.number() }).passthrough().parse(expectOk("verify", response)).reward;
    });
    boundary = { next: "return", answer, reward };
    // An episode finishing while Gym is prepared waits here without delivering its result.
    await ep.boundary(boundary);
  }

  const done = boundary;
  await ep.finishing(async () => {
    // Final clean-up is never interrupted by retire; failures here do not change the result.
    await postJson(`${agent}${rolloutPath(ep.key, "/close_session")}`, {}).catch(() => undefined);
  });
  return { rollout_id: ep.id.rollout_id, attempt: ep.id.attempt, reward: done.reward, answer: done.answer, continued_from: continuedFrom };
}
