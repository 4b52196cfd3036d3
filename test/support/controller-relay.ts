import type { Msg } from "@nats-io/transport-node";
import type { GymWorld } from "./gym-processes.js";

/** What the relay does with one controller op: forward it, keep it (never forwarded), or forward it and drop the reply. */
export type RelayAction = "pass" | "hold" | "drop-reply";

export interface ControllerRelay {
  /** The deployment to give the collector: its controller ops reach the coordinator through the relay. */
  deployment: string;
  seen: { op: string; action: RelayAction }[];
  /** Resolves when an op is decided (`op`), or when one whose reply is dropped was answered by the coordinator (`op:done`). */
  when(pred: (op: string, action: RelayAction) => boolean): Promise<void>;
  close(): Promise<void>;
}

/**
 * A NATS relay between a controller (deployment `<real>-relay`) and the coordinator, so a test can
 * SIGKILL the controller at an exact moment: with an op held (never reaches the coordinator) or
 * after the coordinator did it but before its reply arrived. `decide` sees each op and its count.
 */
export async function startControllerRelay(w: GymWorld, decide: (op: string, n: number) => RelayAction): Promise<ControllerRelay> {
  const nc = await w.nats.connect();
  const seen: ControllerRelay["seen"] = [];
  const counts = new Map<string, number>();
  const waiters: { pred: (op: string, action: RelayAction) => boolean; resolve: () => void }[] = [];
  const notify = (op: string, action: RelayAction) => {
    for (const waiter of [...waiters]) {
      if (!waiter.pred(op, action)) continue;
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve();
    }
  };
  const relay = (msg: Msg) => {
    const op = msg.subject.split(".").pop()!;
    const n = (counts.get(op) ?? 0) + 1;
    counts.set(op, n);
    const action = decide(op, n);
    seen.push({ op, action });
    notify(op, action);
    if (action === "hold") return;
    void nc.request(`gym.ckpt.v1.${w.deployment}.ctl.${op}`, msg.data, { timeout: 120_000, ...(msg.headers && { headers: msg.headers }) }).then(
      (reply) => {
        if (action === "pass") msg.respond(reply.data, reply.headers ? { headers: reply.headers } : undefined);
        else notify(`${op}:done`, action);
      },
      () => undefined,
    );
  };
  nc.subscribe(`gym.ckpt.v1.${w.deployment}-relay.ctl.*`, { callback: (_err, msg) => relay(msg) });
  return {
    deployment: `${w.deployment}-relay`,
    seen,
    when: (pred) => new Promise((resolve) => waiters.push({ pred, resolve })),
    close: () => nc.close(),
  };
}
