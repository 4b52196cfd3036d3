/**
 * The window of a failed restore's all-or-nothing clean-up, max(deadline, now + 30 s): everyone is
 * parked while it runs. How its retire stages share it, and how a failed retire or resume is sent
 * again within it.
 */
import { equalJitter } from "../../protocol/index.js";
import type { Clock } from "./clock.js";
import type { ParticipantRef } from "./participant-client.js";

/** The clean-up's window at least (the protocol's now + 30 s). */
export const RESTORE_CLEANUP_MS = 30_000;
/** Pause before the clean-up's first resend of a failed request, doubled per try up to the cap (each jittered). */
const CLEANUP_RETRY_MS = 100;
const CLEANUP_RETRY_MAX_MS = 5000;

/**
 * The deadline of a clean-up retire stage starting at `nowMs` with `stagesLeft` stages to go (this
 * one included): an equal share of what is left of the window once each later stage's request
 * slack is set aside. So even when every stage before the last waits out its share plus the slack
 * (a stalled participant), the later stages are still sent before the window closes, each with a
 * share, instead of arriving past it and being refused `deadline_exceeded`. A slack too large to set
 * aside so (request_slack_ms near the window) leaves plain equal shares.
 */
export function cleanupStageDeadline(nowMs: number, windowEndMs: number, stagesLeft: number, slackMs: number): number {
  const left = windowEndMs - nowMs;
  const usable = left - (stagesLeft - 1) * slackMs;
  return nowMs + (usable > 0 ? usable : left) / Math.max(stagesLeft, 1);
}

/** What sentAgainUntil leaves: the failures still standing, and those given up as no longer listed. */
export interface SentAgain<F> {
  /** Those not worth a resend, and the last try's. */
  left: F[];
  /**
   * Worth a resend, but the membership registry no longer lists their participant (its heartbeat
   * lapsed, or it left): each one's last failure, never sent again.
   */
  unlisted: F[];
}

/**
 * Sends `resend` to the members of the `failures` that `worthRetrying` says a resend may change,
 * after a jittered pause (100 ms doubling to 5 s), until none is left or the next try would start
 * at `deadlineMs`. Before each pause, a member `listed` no longer shows is given up: a participant
 * down for good would otherwise be sent to (and the clean-up's answer wait) until the deadline, up
 * to 30 s, while one off NATS for a moment keeps its entry (a heartbeat's TTL) and is sent again.
 */
export async function sentAgainUntil<F extends { participant: ParticipantRef }>(
  clock: Clock,
  deadlineMs: number,
  failures: F[],
  worthRetrying: (failure: F) => boolean,
  resend: (members: ParticipantRef[]) => Promise<F[]>,
  listed: (members: ParticipantRef[]) => Promise<ReadonlySet<ParticipantRef>>,
): Promise<SentAgain<F>> {
  let left = failures;
  const unlisted: F[] = [];
  for (let pause = CLEANUP_RETRY_MS; ; pause = Math.min(pause * 2, CLEANUP_RETRY_MAX_MS)) {
    let again = left.filter(worthRetrying);
    if (again.length) {
      const still = await listed(again.map((f) => f.participant));
      const gone = again.filter((f) => !still.has(f.participant));
      unlisted.push(...gone);
      left = left.filter((f) => !gone.includes(f));
      again = again.filter((f) => !gone.includes(f));
    }
    // Jittered: participants failing together are not all sent their retry at one instant.
    const wait = equalJitter(pause, clock.random);
    if (!again.length || clock.now() + wait >= deadlineMs) return { left, unlisted };
    await clock.sleep(wait);
    left = [...left.filter((f) => !worthRetrying(f)), ...(await resend(again.map((f) => f.participant)))];
  }
}
