/**
 * The window of a failed restore's all-or-nothing clean-up, max(deadline, now + 30 s): everyone is
 * parked while it runs. How a failed retire or resume is sent again within it.
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
 * Sends `resend` to the members of the `failures` that `worthRetrying` says a resend may change,
 * after a jittered pause (100 ms doubling to 5 s), until none is left or the next try would start
 * at `deadlineMs`. Returns the failures left: those not worth a resend, and the last try's.
 */
export async function sentAgainUntil<F extends { participant: ParticipantRef }>(
  clock: Clock,
  deadlineMs: number,
  failures: F[],
  worthRetrying: (failure: F) => boolean,
  resend: (members: ParticipantRef[]) => Promise<F[]>,
): Promise<F[]> {
  let left = failures;
  for (let pause = CLEANUP_RETRY_MS; ; pause = Math.min(pause * 2, CLEANUP_RETRY_MAX_MS)) {
    const again = left.filter(worthRetrying);
    // Jittered: participants failing together are not all sent their retry at one instant.
    const wait = equalJitter(pause, clock.random);
    if (!again.length || clock.now() + wait >= deadlineMs) return left;
    await clock.sleep(wait);
    left = [...left.filter((f) => !worthRetrying(f)), ...(await resend(again.map((f) => f.participant)))];
  }
}
