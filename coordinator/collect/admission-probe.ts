import { equalJitter, type RandomSource } from "../../protocol/index.js";
import { delay } from "./delay.js";

/** Waits `seconds`, or less once `until` aborts (delay by default; tests pass a fake clock's). */
export type Sleep = (seconds: number, until: AbortSignal) => Promise<void>;

/**
 * The rows `/run` refused `admission_closed` while no checkpoint of this collector is open
 * (another controller's checkpoint holds the Gym's admission closed): one of them, the probe, is
 * sent again after a wait of `firstS`, doubled per refusal in a row up to `maxS`, each jittered
 * (equal jitter); the others wait for its answer and go again together once a `/run` sent after
 * the last one refused is admitted (a reply to one sent before says nothing: a row finishing while
 * the other checkpoint's prepare runs would otherwise send every waiting row again, each time).
 * So while admission stays closed the collector sends about one `/run` per `maxS` whatever its
 * --concurrency (each row re-sent every quarter second was 40,000 requests a second at 10,000), and
 * once it reopens the rows are sent again at most `maxS` later.
 */
export class AdmissionProbe<Row> {
  /** The row that is sent again while the others wait; undefined when none is refused. */
  private probe: Row | undefined;
  /** Refusals of the probe in a row: its next wait is firstS · 2^refusals, up to maxS. */
  private refusals = 0;
  /** Tickets (sending()) of the /runs sent so far, and of the last one sent that was refused. */
  private sent = 0;
  private lastRefused = 0;
  private waiting: { row: Row; wake: () => void }[] = [];
  /** Aborted to cut the probe's wait short (a stop). */
  private sleeping = new AbortController();

  constructor(
    private readonly firstS: number,
    private readonly maxS: number,
    private readonly sleep: Sleep = delay,
    private readonly random: RandomSource = Math.random,
  ) {}

  /** Rows waiting for the probe's answer (tests). */
  get waitingRows(): number {
    return this.waiting.length;
  }

  /** A /run is about to be sent: its ticket, for refused() and admitted(). */
  sending(): number {
    return ++this.sent;
  }

  /**
   * `row`'s /run `ticket` was refused admission: resolves when it is to be sent again. The first
   * row refused (or the probe, refused again) waits its backoff; any other waits for admitted(),
   * for the probe to leave (it then becomes the probe, sent at once), or for wakeAll().
   */
  async refused(row: Row, ticket: number): Promise<void> {
    this.lastRefused = Math.max(this.lastRefused, ticket);
    if (this.probe !== undefined && this.probe !== row) {
      await new Promise<void>((wake) => this.waiting.push({ row, wake }));
      return;
    }
    this.probe = row;
    const seconds = Math.min(this.maxS, this.firstS * 2 ** this.refusals);
    this.refusals++;
    await this.sleep(equalJitter(seconds * 1000, this.random) / 1000, this.sleeping.signal);
  }

  /**
   * `/run` `ticket` got an answer other than admission_closed: if it was sent after the last one
   * refused, admission reopened, every row waiting is sent again now, and the next refusal starts
   * the backoff over.
   */
  admitted(ticket: number): void {
    if (ticket > this.lastRefused) this.reopen();
  }

  private reopen(): void {
    this.probe = undefined;
    this.refusals = 0;
    for (const { wake } of this.waiting.splice(0)) wake();
  }

  /**
   * `row`'s dispatch ended (finished, failed, stopped) : if it was the probe, the next row waiting
   * takes over and is sent at once (its backoff goes on), so no row waits for a probe that is gone.
   */
  left(row: Row): void {
    if (this.probe !== row) return;
    const next = this.waiting.shift();
    this.probe = next?.row;
    if (!next) this.refusals = 0;
    next?.wake();
  }

  /** The collection stops: every row waiting, and the probe's wait, ends now (they see it stopping). */
  wakeAll(): void {
    this.sleeping.abort();
    this.sleeping = new AbortController();
    this.reopen();
  }
}
