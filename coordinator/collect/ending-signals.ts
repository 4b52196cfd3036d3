/**
 * SIGTERM, SIGINT and SIGHUP for `collect` from the moment it starts. Until the collector's own
 * handler exists (it needs the lock, which needs --tasks read), Node's default action would kill
 * the process: a death by signal, not the exit 75 (requeue) a scheduler acts on. A SIGTERM then is
 * kept for that handler, and aborts `sigtermBeforeHandler()`, on which the CLI gives up its start-up
 * (a --tasks that never delivers included) and exits 75 with nothing held. A SIGINT or SIGHUP still
 * takes Node's default at once (the shell reports 130 or 129): nothing is held yet, and Ctrl-C must
 * not wait for a stalled --tasks (process.exit would: it waits for a read blocking a libuv thread).
 * No imports: the CLI's entry module installs the listeners before anything else loads.
 */
export type EndingSignal = "SIGTERM" | "SIGINT" | "SIGHUP";

let keptSigterm = false;
const sigtermKept = new AbortController();
let handler: ((signal: EndingSignal) => void) | undefined;
const listeners = new Map<EndingSignal, () => void>();
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"] as const) {
  listeners.set(signal, () => {
    if (handler) return handler(signal);
    if (signal === "SIGTERM") {
      keptSigterm = true;
      return sigtermKept.abort();
    }
    endBySignal(signal);
  });
}

/**
 * Ends the process by `signal` itself, as its default action would, so a parent sees a death by
 * that signal (a hangup), not an exit code. False when some other listener keeps the signal from
 * its default action: the caller exits otherwise.
 */
export function endBySignal(signal: EndingSignal): boolean {
  process.off(signal, listeners.get(signal)!);
  if (process.listenerCount(signal) > 0) return false;
  process.kill(process.pid, signal);
  return true;
}

/** Listens (once, however often called); until `handleEndingSignals`, as described above. */
export function listenForEndingSignals(): void {
  for (const [signal, listener] of listeners) if (!process.listeners(signal).includes(listener)) process.on(signal, listener);
}

/** Aborted once a SIGTERM is kept, that is one arriving before `handleEndingSignals`. */
export function sigtermBeforeHandler(): AbortSignal {
  return sigtermKept.signal;
}

/** From now on each signal goes to `onSignal`; a SIGTERM kept so far goes to it now. */
export function handleEndingSignals(onSignal: (signal: EndingSignal) => void): void {
  listenForEndingSignals();
  handler = onSignal;
  if (!keptSigterm) return;
  keptSigterm = false;
  onSignal("SIGTERM");
}
