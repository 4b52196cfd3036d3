/** Runs `fn` after `ms`; returns a cancel function (a Clock's setTimer). */
export type SetTimer = (fn: () => void, ms: number) => () => void;

const unrefTimer: SetTimer = (fn, ms) => {
  const timer = setTimeout(fn, ms);
  timer.unref();
  return () => clearTimeout(timer);
};

/**
 * `work`, or a rejection `no answer within <ms> ms` once `ms` pass first; the timer is cleared
 * either way. `work` goes on after a timeout (its outcome is ignored, never unhandled): for
 * start-up reads that must not hold a process up when a server does not answer.
 */
export function within<T>(work: Promise<T>, ms: number, setTimer: SetTimer = unrefTimer): Promise<T> {
  work.catch(() => undefined);
  let cancel: (() => void) | undefined;
  const timedOut = new Promise<never>((_, reject) => (cancel = setTimer(() => reject(new Error(`no answer within ${ms} ms`)), ms)));
  return Promise.race([work, timedOut]).finally(() => cancel?.());
}

/** A timer that keeps the process up while it runs: a bounded stop step must not be cut by an empty event loop. */
const refTimer: SetTimer = (fn, ms) => {
  const timer = setTimeout(fn, ms);
  return () => clearTimeout(timer);
};

/**
 * Whether `work` resolved within `ms`: false once `ms` pass first (`work` goes on, its outcome
 * ignored), a rejection first rejects. The timer is cleared either way. For stop steps that must
 * end in bounded time: a drain, a delete or in-flight ops with NATS down.
 */
export function finishedWithin(work: Promise<unknown>, ms: number, setTimer: SetTimer = refTimer): Promise<boolean> {
  work.catch(() => undefined);
  let cancel: (() => void) | undefined;
  const timedOut = new Promise<false>((resolve) => (cancel = setTimer(() => resolve(false), ms)));
  return Promise.race([work.then(() => true as const), timedOut]).finally(() => cancel?.());
}
