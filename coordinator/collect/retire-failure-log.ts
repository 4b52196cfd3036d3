import type { Logger } from "pino";

/**
 * The log of one spell of failing retires (a Gym server down or restarting): its first failure is
 * a warning, the tries after it (one per failed row, then one per retry pause, for up to
 * --run-timeout-s) are debug, and the first retire that goes through again ends the spell in one
 * line saying how long it lasted. Each try at warn, stack and all, flooded the log for as long as
 * the server stayed down.
 */
export class RetireFailureLog {
  private since: number | undefined;
  private failedTries = 0;

  constructor(private readonly logger: Logger) {}

  /** A retire failed; `msg` says what happens next. */
  failed(err: unknown, msg: string): void {
    this.failedTries++;
    if (this.since !== undefined) {
      this.logger.debug({ err, failed_tries: this.failedTries }, msg);
      return;
    }
    this.since = performance.now();
    this.logger.warn({ err }, `${msg} (until one goes through, further failures are logged at debug)`);
  }

  /** A retire went through: a spell of failures, if one was logged, is over. */
  succeeded(): void {
    if (this.since === undefined) return;
    this.logger.info({ failed_tries: this.failedTries, failing_s: Math.round((performance.now() - this.since) / 100) / 10 }, "retires go through again");
    this.since = undefined;
    this.failedTries = 0;
  }
}
