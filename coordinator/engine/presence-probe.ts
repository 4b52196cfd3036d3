import type { Clock } from "./clock.js";
import { NoRespondersFailure, RequestTimeoutFailure, type ParticipantTransport } from "./transport.js";

/** Probes in a row that must find nothing subscribed before a try is given up (≥ 3 probe periods: a reconnect takes ~2 s). */
export const ABSENT_PROBES = 4;

/**
 * The process a try waits on is gone from NATS: nothing was subscribed to its status subject for
 * several probes in a row (it died, or lost its connection for longer than a reconnect takes). An
 * unknown outcome like a timeout — it may have acted before it went — given up before the try's timer.
 */
export class ProcessGoneFailure extends RequestTimeoutFailure {
  /** `who`: the participant, as kind/instance. */
  constructor(who: string, probes: number, everyMs: number) {
    super(who, 0);
    this.message = `${who} left NATS while the try waited (no responders on its status subject in ${probes} probes ${everyMs} ms apart)`;
    this.name = "ProcessGoneFailure";
  }
}

export interface PresenceProbeOptions {
  transport: ParticipantTransport;
  clock: Clock;
  token: string;
  /** Period of the probes; the first is sent once the try has waited this long. */
  everyMs: number;
}

/**
 * While a try waits on a participant, asks every `everyMs` whether anything is still subscribed
 * to that participant's status subject (a `status` request: a live process answers it while it
 * works on the op, the endpoint handles requests concurrently). Only the server's no-responders,
 * `ABSENT_PROBES` times in a row, calls `gone`: a reply, a timeout (a process too busy to answer
 * is still there) or a lost connection says nothing, and starts the count again. Without it a
 * process that died mid-op with no replacement held the op until the try timed out
 * (`request_attempt_ms`). Returns the function that stops the probes.
 */
export function probePresence(statusSubject: string, who: string, options: PresenceProbeOptions, gone: (failure: ProcessGoneFailure) => void): () => void {
  const { transport, clock, token, everyMs } = options;
  let stopped = false;
  let absent = 0;
  let cancelTimer = clock.setTimer(probe, everyMs);
  function probe(): void {
    transport.request(statusSubject, "{}", { timeoutMs: everyMs, token, sentAtMs: clock.now() }).then(
      () => next(false),
      (error: unknown) => next(error instanceof NoRespondersFailure),
    );
  }
  function next(nobody: boolean): void {
    if (stopped) return;
    absent = nobody ? absent + 1 : 0;
    if (absent >= ABSENT_PROBES) return gone(new ProcessGoneFailure(who, absent, everyMs));
    // Paced from the answer, not a fixed interval: a slow probe never overlaps the next one.
    cancelTimer = clock.setTimer(probe, everyMs);
  }
  return () => {
    stopped = true;
    cancelTimer();
  };
}
