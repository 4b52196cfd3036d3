import type { Logger } from "pino";
import { z } from "zod";
import { rolloutPath } from "../../../protocol/index.js";
import type { StepEpisode, StepMode } from "../../kinds/environment/index.js";
import { expectOk, isRefusal, postJson, sessionCookieFrom } from "./gym-http.js";
import type { GymTask } from "./gym-task.js";

/**
 * A reference episode's session at the resources server, the same for the Gym environment and the
 * legacy agent loop: seeded first, ended by a successful verify, closed when the episode fails
 * before that.
 */

/**
 * How long a `close_session` clean-up (the agent's, and the resources session of a failed episode)
 * may take. Its failure is ignored anyway, and an episode in final clean-up is not interrupted by
 * retire, so a hung callee must not keep it (a blocker) alive until the episode deadline. For the
 * resources session it counts only outside checkpoints (the server parks the close until resume).
 */
export const CLOSE_SESSION_TIMEOUT_MS = 5000;

/** What an episode keeps of its seeded session: the cookie the resources server set, and how its verify runs. */
export interface SeededSession {
  cookie: string | null;
  verify_mode: "replay" | "wait";
}

/** The episode's resources session while it is open: seeded or restored, until its verify ended it. */
export interface OpenResourcesSession {
  session?: SeededSession | undefined;
}

/** Whether a retire stopped the episode: the retire frees its sessions at the callees itself, so no clean-up call goes there. */
export function retiredEpisode(ep: StepEpisode): boolean {
  return ep.signal.aborted && isRefusal(ep.signal.reason, "stale_attempt");
}

function cookieHeader(cookie: string | null): Record<string, string> {
  return cookie ? { cookie: `ng_session=${cookie}` } : {};
}

/**
 * The `replay` step that starts every reference episode: the resources server seeds the rollout's
 * session. It may say this rollout is a restart (its earlier attempt was lost), which the episode
 * records before going on. The session goes into `open` as soon as its seed reply arrived, so an
 * episode failing anywhere after that (its deadline, a refused `markRestart`) closes it. Refused
 * `admission_closed` (it never ran: a resources server that starts no session while its checkpoint
 * is open), it parks and is sent again after resume, as `verifyAnswer` does: passed on, `/run`
 * would answer it as a failure and its caller would spend another attempt on the same rollout.
 */
export async function seedSession(ep: StepEpisode, resourcesUrl: string, task: GymTask, open: OpenResourcesSession): Promise<SeededSession> {
  let restart: boolean | undefined;
  while (restart === undefined) {
    try {
      restart = await ep.step("replay", async (signal) => {
        const response = await postJson(`${resourcesUrl}${rolloutPath(ep.key, "/seed_session")}`, { task }, { signal });
        expectOk("seed_session", response);
        open.session = {
          cookie: sessionCookieFrom(response.headers) ?? null,
          verify_mode: response.headers.get("x-ng-checkpoint-verify") === "replay" ? "replay" : "wait",
        };
        return response.headers.get("x-ng-checkpoint-restart") === "1";
      });
    } catch (error) {
      if (!isRefusal(error, "admission_closed")) throw error;
      await ep.park();
    }
  }
  const seeded = open.session!;
  if (restart) await ep.markRestart();
  return seeded;
}

/**
 * The `verify` step (its mode from the seed): the reward, which ends the session. Refused
 * `admission_closed` before it ran (the resources server closed admission for a checkpoint), it
 * parks at the verify boundary and is sent again after resume: passed on, `/run` would answer
 * admission_closed for an episode that already ran its agent, and its caller would send the same
 * attempt again from the input.
 */
export async function verifyAnswer(ep: StepEpisode, resourcesUrl: string, task: GymTask, session: SeededSession, answer: string): Promise<number> {
  for (;;) {
    try {
      return await ep.step(session.verify_mode as StepMode, async (signal) => {
        const response = await postJson(`${resourcesUrl}${rolloutPath(ep.key, "/verify")}`, { task, answer }, { signal, headers: cookieHeader(session.cookie) });
        return z.object({ reward: z.number() }).passthrough().parse(expectOk("verify", response)).reward;
      });
    } catch (error) {
      if (!isRefusal(error, "admission_closed")) throw error;
      await ep.park();
    }
  }
}

/**
 * Best-effort `close_session` of a session its failed episode leaves open (a verify that ran ended
 * it): only a verify ends a resources session otherwise, so every failed episode's would be held
 * for good, exported by every checkpoint, or reported as a restart by a restart-only server until
 * its prepare reply no longer fit one message. The server parks the close while a checkpoint is
 * open, for as long as that checkpoint lasts, so `timeoutMs` counts only outside checkpoints
 * (`ep.timed`): given up earlier, the close would leave the session open there. A close that fails
 * all the same is logged, not thrown: the session then stays until a retire of its rollout.
 */
export async function closeResourcesSession(
  ep: StepEpisode,
  resourcesUrl: string,
  session: Pick<SeededSession, "cookie">,
  options: { timeoutMs?: number | undefined; logger?: Logger | undefined } = {},
): Promise<void> {
  try {
    await ep.timed(options.timeoutMs ?? CLOSE_SESSION_TIMEOUT_MS, async (signal) =>
      expectOk("close_session", await postJson(`${resourcesUrl}${rolloutPath(ep.key, "/close_session")}`, {}, { signal, headers: cookieHeader(session.cookie) })),
    );
  } catch (error) {
    options.logger?.warn({ episode: ep.key, err: error }, "closing the failed episode's resources session failed; it stays open at the resources server until a retire of its rollout frees it");
  }
}

/**
 * The `close_session` (a replay step: after a crash it runs again) of the session an episode
 * restored past its verify still holds at the resources server. A replayable verify that ends
 * while a checkpoint is open ends its session only when that checkpoint closes, so the checkpoint
 * may hold the session beside the episode's `return` boundary, and a restore brings it back as the
 * next attempt's, which no verify ends any more. A failed close is logged, not thrown: the
 * recorded result stands (the session then stays until a retire of its rollout frees it).
 */
export async function closeRestoredSession(ep: StepEpisode, resourcesUrl: string, cookie: string, logger?: Logger): Promise<void> {
  try {
    await ep.step("replay", async (signal) =>
      expectOk("close_session", await postJson(`${resourcesUrl}${rolloutPath(ep.key, "/close_session")}`, {}, { signal, headers: cookieHeader(cookie) })),
    );
  } catch (error) {
    // Retired or out of time: the episode ends as any other would.
    if (ep.signal.aborted) throw error;
    logger?.warn({ episode: ep.key, err: error }, "closing the resources session of an episode restored past its verify failed; it stays open at the resources server until a retire of its rollout frees it");
  }
}
