import { clearTimeout, setTimeout } from "node:timers";

/**
 * A signal that aborts with a `TimeoutError` after `ms`, held by its own timer until it fires or
 * `clear()` (call it once the wait is over). Not `AbortSignal.timeout()`: Node 20's
 * `AbortSignal.any()` holds its sources weakly and a timeout signal's timer holds it weakly too, so
 * one whose only holder is the composite is collected by the next full GC, never fires, and the wait
 * it bounds never ends (nodejs/node#57736). The timer is unref'd: it keeps no process alive. Taken
 * from node:timers, as AbortSignal.timeout's is internal: a test that speeds up the global
 * setTimeout (undici's clock, fake timers) leaves a deadline in real time.
 */
export function timeoutSignal(ms: number): { signal: AbortSignal; clear: () => void } {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new DOMException(`timed out after ${ms} ms`, "TimeoutError")), ms);
  timer.unref();
  return { signal: controller.signal, clear: () => clearTimeout(timer) };
}
