import { mulberry32 } from "../support/seeded-random.js";

/**
 * The faults of one seed, drawn from it alone (same seed, same schedule), so a failure is re-run
 * with `--seeds N`. Times are milliseconds after the collector's first start.
 */
export type FaultKind =
  | "kill-leader" // SIGKILL the leading coordinator, restart it after `pauseMs`
  | "stop-coordinator" // SIGSTOP one coordinator for `pauseMs`, then SIGCONT
  | "kill-gym-server" // SIGKILL one Gym server (`target`), restart it after `pauseMs`
  | "kill-gym" // SIGKILL every Gym server (the policy backend survives), restart after `pauseMs`
  | "kill-collector" // SIGKILL the collector, restart it with the same arguments after `pauseMs`
  | "usr1-collector" // SIGUSR1: checkpoint now
  | "kill-collector-twice" // SIGKILL, restart, SIGKILL again `pauseMs` into its start-up (its restore), restart
  | "kill-node" // the collector and every Gym server at once (a preempted node), both restarted after `pauseMs`
  | "restart-nats"; // SIGKILL nats-server, start it again on the same port and store after `pauseMs`

export interface Fault {
  atMs: number;
  kind: FaultKind;
  pauseMs: number;
  /** The Gym server for kill-gym-server; for stop-coordinator, "leader" or "follower". */
  target?: string;
  /**
   * Aimed at a checkpoint: from `atMs` on, wait for the collector's next prepare (its
   * `{"checkpoint_id"}` line in dispatched.jsonl), then `offsetMs` more. Random times mostly miss the
   * short checkpoints, where a crash is most interesting.
   */
  inCheckpoint?: { offsetMs: number };
}

const KINDS: FaultKind[] = ["kill-leader", "stop-coordinator", "kill-gym-server", "kill-gym", "kill-collector", "usr1-collector", "kill-collector-twice", "kill-node", "restart-nats"];
const GYM_SERVERS = ["model", "resources", "agent", "environment"];

export function faultSchedule(seed: number, windowMs: number): Fault[] {
  const random = mulberry32(seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
  const between = (lo: number, hi: number) => Math.round(lo + random() * (hi - lo));
  const count = between(2, 6);
  const faults: Fault[] = [];
  for (let i = 0; i < count; i++) {
    const kind = pick(KINDS);
    const atMs = between(1_000, windowMs);
    const aimed = kind !== "usr1-collector" && random() < 0.5 ? { inCheckpoint: { offsetMs: between(0, 400) } } : {};
    switch (kind) {
      case "kill-leader":
        faults.push({ atMs, kind, pauseMs: between(500, 4_000), ...aimed });
        break;
      case "stop-coordinator":
        faults.push({ atMs, kind, pauseMs: between(1_000, 4_000), target: pick(["leader", "follower"]), ...aimed });
        break;
      case "kill-gym-server":
        faults.push({ atMs, kind, pauseMs: between(200, 3_000), target: pick(GYM_SERVERS), ...aimed });
        break;
      case "kill-gym":
      case "kill-collector":
      case "kill-node":
      case "restart-nats":
        faults.push({ atMs, kind, pauseMs: between(200, 3_000), ...aimed });
        break;
      case "usr1-collector":
        faults.push({ atMs, kind, pauseMs: 0 });
        break;
      case "kill-collector-twice":
        faults.push({ atMs, kind, pauseMs: between(100, 2_000), ...aimed });
        break;
    }
  }
  return faults.sort((a, b) => a.atMs - b.atMs);
}

export function describeFault(f: Fault): string {
  const when = f.inCheckpoint ? `@ckpt>${(f.atMs / 1000).toFixed(1)}s+${f.inCheckpoint.offsetMs}ms` : `@${(f.atMs / 1000).toFixed(1)}s`;
  return `${f.kind}${f.target ? `:${f.target}` : ""}${when}${f.pauseMs ? `+${(f.pauseMs / 1000).toFixed(1)}s` : ""}`;
}

/** Whether a fault of this schedule legitimately loses work done since the last checkpoint (a row's model calls made again). */
export function losesWork(f: Fault): boolean {
  return f.kind !== "kill-leader" && f.kind !== "stop-coordinator" && f.kind !== "usr1-collector";
}
