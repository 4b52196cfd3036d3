import type { Logger } from "pino";
import { CheckpointError } from "../../protocol/index.js";
import type { Clock } from "./clock.js";

/**
 * Offsets up to this are not reported. The measured offset (this clock at arrival minus the
 * coordinator's send time, Gym-Sent-At) includes the one-way delivery delay, a few ms on NATS and
 * more while a loaded process queues the message, so a smaller one says nothing about the clocks;
 * one beyond it already eats a visible share of deadlines and leases measured in seconds.
 */
export const CLOCK_SKEW_THRESHOLD_MS = 1000;

/** At most one clock_skew warning per this interval: every op carries the offset, the log must not repeat it per op. */
export const CLOCK_SKEW_WARN_EVERY_MS = 60_000;

/** The refusal of an op whose deadline had passed when it was checked (on arrival, and again under the lock). */
export const DEADLINE_PASSED = "the deadline has already passed";

/** The start of the refusal of a deadline past the cap (usually milliseconds sent as seconds). */
export const DEADLINE_TOO_FAR = "deadline_ts lies more than";

/**
 * Compares the coordinator's send time of each op with this participant's clock: deadlines and
 * leases are absolute instants of the coordinator's clock read on this one, so a skew between the
 * two refuses ops (`deadline_exceeded`) or ends leases early. Logs `clock_skew` (a warning, at most
 * once per CLOCK_SKEW_WARN_EVERY_MS) while an offset is beyond the threshold, and
 * `clock_skew_cleared` once when one is back within it.
 */
export class ClockSkewWatch {
  /** The last offset observed (ms; positive: this clock ahead), for the gauge. */
  lastOffsetMs: number | undefined;
  private warnedAt: number | undefined;

  constructor(
    private readonly clock: Clock,
    private readonly logger: Logger | undefined,
  ) {}

  /** The offset of an op sent at `sentAtMs` (the coordinator's clock) that arrives now. */
  observe(sentAtMs: number, fields: { op: string; epoch?: number | undefined }): number {
    const offsetMs = this.clock.now() - sentAtMs;
    this.lastOffsetMs = offsetMs;
    // Rate-limited on the monotonic clock: the step that fixes the skew must not hold the next warning back.
    const at = this.clock.monotonic ? this.clock.monotonic() : this.clock.now();
    if (Math.abs(offsetMs) > CLOCK_SKEW_THRESHOLD_MS) {
      if (this.warnedAt === undefined || at - this.warnedAt >= CLOCK_SKEW_WARN_EVERY_MS) {
        this.warnedAt = at;
        this.logger?.warn({ offset_ms: offsetMs, ...fields }, "clock_skew");
      }
    } else if (this.warnedAt !== undefined) {
      this.warnedAt = undefined;
      this.logger?.info({ offset_ms: offsetMs, ...fields }, "clock_skew_cleared");
    }
    return offsetMs;
  }
}

/**
 * `error`, or, when it is a deadline refusal a clock skew beyond the threshold explains, that
 * refusal with the skew in its detail: this clock ahead, a deadline already passed; this clock far
 * behind (one reset to 1970), a deadline past the cap. Without it the operator sees every op
 * refused for a deadline that, by the coordinator's clock, was fine.
 */
export function explainSkew(error: unknown, offsetMs: number | undefined): unknown {
  if (offsetMs === undefined || Math.abs(offsetMs) <= CLOCK_SKEW_THRESHOLD_MS || !(error instanceof CheckpointError)) return error;
  const passed = offsetMs > 0 && error.code === "deadline_exceeded" && error.message === DEADLINE_PASSED;
  const tooFar = offsetMs < 0 && error.code === "invalid_request" && error.message.startsWith(DEADLINE_TOO_FAR);
  if (!passed && !tooFar) return error;
  const seconds = (Math.abs(offsetMs) / 1000).toFixed(1);
  return new CheckpointError(
    error.code,
    `${error.message}: this participant's clock reads ${seconds} s ${passed ? "ahead of" : "behind"} the coordinator's (by the op's send time, network delay included); deadlines are absolute, so keep the hosts' clocks in sync (NTP, chrony)`,
    { cause: error },
  );
}
