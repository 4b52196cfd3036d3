import { dieByHangup } from "../../protocol/index.js";

/** Where the daemon's start-up is, for a stop signal: see `listenForStop`. */
export type StartupPhase = "preparing" | "campaigning" | "running";

/**
 * SIGTERM, SIGINT and SIGHUP (its terminal closed) for `gym-ckpt coordinator`, listened for from before its start-up: Node's
 * default action would kill a process whose lease campaign already created the leader key, leaving
 * the key held for a whole lease while successors wait. The returned promise resolves at the first
 * one; the caller then stops the daemon (releasing the key) once start-up settled. Before the
 * campaign nothing needs releasing and a start-up stalled on NATS must not outlive the signal, so
 * the process exits at once then; during the campaign it waits at most `campaignBoundMs` for start-up
 * and the stop (by then a key it created is about to expire anyway). A second SIGTERM or SIGINT
 * exits at once; a second SIGHUP is ignored: a closing terminal often sends two (the kernel's to
 * the foreground group, the shell's to its jobs), and exiting on the second would end the stop
 * halfway, the lease key left held.
 */
export function listenForStop(phase: () => StartupPhase, campaignBoundMs: number): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    let requested = false;
    const onSignal = (signal: NodeJS.Signals) => {
      const now = phase();
      if (requested && signal === "SIGHUP") return;
      if (requested) process.exit();
      if (now === "preparing") return exitAfterStop(signal);
      requested = true;
      if (now === "campaigning") setTimeout(() => exitAfterStop(signal), campaignBoundMs).unref();
      resolve(signal);
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);
    process.on("SIGHUP", onSignal);
  });
}

/** Ends the process once stopped for `signal`; after a hangup by SIGHUP itself (dieByHangup). */
export function exitAfterStop(signal: NodeJS.Signals | undefined): void {
  if (signal !== "SIGHUP") process.exit();
  dieByHangup();
}
