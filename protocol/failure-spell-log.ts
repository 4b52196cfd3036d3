/** Past this many different failures in one spell, the rest are debug too. */
const MAX_KINDS_WARNED = 8;

/** What a spell's lines (and the NATS status lines, nats-status-log.ts) go to: a pino logger fits. */
export interface SpellLogger {
  warn(fields: object, message: string): void;
  info(fields: object, message: string): void;
  debug(fields: object, message: string): void;
}

/**
 * The log of one spell of a failure a process retries by itself (a Gym server down for the
 * collector's retires, NATS unreachable for a participant's heartbeat): its first failure is a
 * warning, the tries after it are debug, and the first success ends the spell in one info line
 * (`ended`, with `failed_tries` and `failing_s`). A different failure within the spell (another
 * message or code) warns again. The message is the caller's, unchanged (an event
 * name stays greppable); the warning says `repeats_logged_at: "debug"`. One warning with its stack per try filled the
 * log for as long as the outage lasted.
 */
export class FailureSpellLog {
  private since: number | undefined;
  private failedTries = 0;
  /**
   * The failures (message and code) this spell warned of: another one warns again, once (failures
   * that alternate, as a retry's "retrying" and "retried later" may, warn once each, not each try).
   */
  private readonly warnedOf = new Set<string>();

  constructor(
    private readonly logger: SpellLogger | undefined,
    private readonly ended: string,
  ) {}

  /** A try failed; `message` says what failed and what happens next. */
  failed(err: unknown, message: string, fields: object = {}): void {
    this.failedTries++;
    const kind = `${message}\u0000${failureCode(err, fields) ?? ""}`;
    if (this.since !== undefined && (this.warnedOf.has(kind) || this.warnedOf.size >= MAX_KINDS_WARNED)) {
      this.logger?.debug({ ...fields, err, failed_tries: this.failedTries }, message);
      return;
    }
    // A new spell, or another failure within one (unreachable, then unauthorized): news, so a warning.
    this.since ??= performance.now();
    this.warnedOf.add(kind);
    // Said on the line, so a quiet log after it is not read as the failure having ended.
    this.logger?.warn({ ...fields, err, repeats_logged_at: "debug" }, message);
  }

  /** A try succeeded: a spell of failures, if there was one, is over. */
  succeeded(fields: object = {}): void {
    if (this.since === undefined) return;
    this.logger?.info({ ...fields, failed_tries: this.failedTries, failing_s: Math.round((performance.now() - this.since) / 100) / 10 }, this.ended);
    this.since = undefined;
    this.failedTries = 0;
    this.warnedOf.clear();
  }
}

/** The code a failure is known by: its error's (a catalog code, a system error's), else the line's `code` field. */
function failureCode(err: unknown, fields: object): string | undefined {
  const code = (err as { code?: unknown } | null | undefined)?.code ?? (fields as { code?: unknown }).code;
  return typeof code === "string" ? code : undefined;
}
