import { equalJitter } from "../../../protocol/index.js";
import type { Clock } from "../../control-plane/clock.js";

/** The first retry of a call a callee refused (`admission_closed`): short, so a blocker reaches its boundary and a prepare waiting on it stays fast. */
export const PARK_RETRY_MS = 100;

/**
 * The longest wait between retries. A callee keeps refusing while its checkpoint is open (seconds
 * to minutes, a controller working between prepare and resume); 2 s cuts what each blocked session
 * sends it from 10 to 0.5 requests a second, and delays the call after the callee reopens by at
 * most 2 s, well inside an op's default deadline (60 s).
 */
export const PARK_RETRY_MAX_MS = 2_000;

/**
 * How long a session (or episode) waits before it sends a refused call again: PARK_RETRY_MS,
 * doubled per refusal in a row up to PARK_RETRY_MAX_MS, from PARK_RETRY_MS again once a call got
 * through. Each wait is jittered (equal jitter: between half and all of it): a change of our own
 * admission wakes every parked session at once, and thousands of them would otherwise retry at
 * the same instants. The clock's random source draws it, so tests pin it.
 */
export class ParkBackoff {
  private delayMs = PARK_RETRY_MS;

  constructor(private readonly clock: Pick<Clock, "random"> = {}) {}

  /** The wait before this refusal's retry; the next one's grown wait is twice as long (up to the cap). */
  next(): number {
    const ms = this.delayMs;
    this.delayMs = Math.min(ms * 2, PARK_RETRY_MAX_MS);
    return equalJitter(ms, this.clock.random);
  }

  /** A call got through (a callee answered it, or the loop reached a boundary): the next refusal starts over. */
  reset(): void {
    this.delayMs = PARK_RETRY_MS;
  }
}
