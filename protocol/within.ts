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
