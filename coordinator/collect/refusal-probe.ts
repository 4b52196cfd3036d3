import { equalJitter, type RandomSource } from "../../protocol/index.js";
import { delay } from "./delay.js";

/** Waits `seconds`, or less once `until` aborts (delay by default; tests pass a fake clock's). */
export type Sleep = (seconds: number, until: AbortSignal) => Promise<void>;

/**
 * The rows whose `/run` was refused for a cause that is not theirs but the Gym's (or this
 * collector's), the same for every row: admission closed by another controller's checkpoint, or no
 * connection to --run-url (the Gym down or restarting, or no file descriptor left here). One of
 * them, the probe, is sent again after a wait of `firstS`, doubled per refusal in a row up to
 * `maxS`, each jittered (equal jitter); the others wait for its answer and go again together once a
 * `/run` sent after the last one refused is answered (a reply to one sent before says nothing: a
 * row finishing while the other checkpoint's prepare runs would otherwise send every waiting row
 * again, each time). So while the cause lasts the collector sends about one `/run` per `maxS`
 * whatever its --concurrency (each row re-sent on its own was 40,000 requests a second at 10,000
 * for a closed admission, and 10,000 connects a second, as many sockets open at once, for a Gym
 * down), and once it is gone the rows are sent again at most `maxS` later.
 *
 * A row may bound its wait (`giveUpS`, its own --run-timeout-s for no connection): a waiting row
 * whose bound passes stops waiting without being sent again, and the probe's wait is cut to it.
 */
export class RefusalProbe<Row> {
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

  /** Whether a row probes now (rows were refused and the cause is not known gone). */
  get probing(): boolean {
    return this.probe !== undefined;
  }

  /** Rows waiting for the probe's answer (tests). */
  get waitingRows(): number {
    return this.waiting.length;
  }

  /** A /run is about to be sent: its ticket, for refused() and answered(). */
  sending(): number {
    return ++this.sent;
  }

  /**
   * `row`'s /run `ticket` was refused: resolves when it is to be sent again (true), or when its
   * wait reached `giveUpS` first (false: it was not sent again and waits no more). The first row
   * refused (or the probe, refused again) waits its backoff (at most `giveUpS`); any other waits for
   * answered(), for the probe to leave (it then becomes the probe, sent at once), for wakeAll(), or
   * for `giveUpS`.
   */
  async refused(row: Row, ticket: number, giveUpS = Infinity): Promise<boolean> {
    this.lastRefused = Math.max(this.lastRefused, ticket);
    if (this.probe !== undefined && this.probe !== row) return this.waitForProbe(row, giveUpS);
    this.probe = row;
    const seconds = Math.min(this.maxS, this.firstS * 2 ** this.refusals);
    this.refusals++;
    await this.sleep(Math.min(equalJitter(seconds * 1000, this.random) / 1000, Math.max(0, giveUpS)), this.sleeping.signal);
    return true;
  }

  private waitForProbe(row: Row, giveUpS: number): Promise<boolean> {
    return new Promise<boolean>((resolve) => {
      const bound = new AbortController();
      const waiter = {
        row,
        wake: () => {
          bound.abort(); // its bound's timer goes
          resolve(true);
        },
      };
      this.waiting.push(waiter);
      if (giveUpS === Infinity) return;
      void this.sleep(Math.max(0, giveUpS), bound.signal).then(() => {
        if (bound.signal.aborted) return;
        const at = this.waiting.indexOf(waiter);
        if (at >= 0) this.waiting.splice(at, 1);
        resolve(false);
      });
    });
  }

  /**
   * `/run` `ticket` got an answer that says the cause is gone (any but admission_closed; any at
   * all for a connection): if it was sent after the last one refused, every row waiting is sent
   * again now, the next refusal starts the backoff over, and true is returned (false: sent before,
   * it says nothing of now). With `wakeAtMost` (a shortage of this collector's file descriptors, where
   * one connection made says one descriptor was free, not that all are), only that many rows waiting
   * longest are sent again, the probe going on: false while others still wait. Each of those that
   * connects wakes as many again, so freed descriptors are taken up in a few round trips, while one
   * refused again stops its branch: a connection costs at most `wakeAtMost` failed ones.
   */
  answered(ticket: number, wakeAtMost = Infinity): boolean {
    if (ticket <= this.lastRefused) return false;
    if (this.waiting.length > wakeAtMost) {
      for (const { wake } of this.waiting.splice(0, wakeAtMost)) wake();
      return false;
    }
    this.reopen();
    return true;
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
