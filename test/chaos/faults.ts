import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describeFault, type Fault } from "./schedule.js";
import { delay } from "./coordinators.js";
import { trackGym, type ChaosWorld } from "./world.js";
import type { ProcessLogs } from "./process-logs.js";

/**
 * Runs a seed's schedule against its world. Each fault starts at its time (they may overlap, as
 * real failures do) and records the interval it was active, for the gap report. A fault falling
 * after the collection ended is skipped: there is nothing left to break.
 */
export interface FaultRecord {
  fault: Fault;
  label: string;
  startMs: number;
  endMs?: number;
  outcome?: string;
}

export function runSchedule(world: ChaosWorld, faults: Fault[], t0: number, logs: ProcessLogs): { records: FaultRecord[]; settled: Promise<void>; cancel(): void } {
  const records: FaultRecord[] = [];
  let cancelled = false;
  const alive = () => !cancelled && !world.collector.done;
  const one = async (fault: Fault) => {
    await delay(Math.max(0, t0 + fault.atMs - Date.now()));
    if (!alive()) return;
    if (fault.inCheckpoint) {
      const id = await nextPrepare(join(world.root, "dispatched.jsonl"), alive);
      logs.note(`fault ${describeFault(fault)} aimed at checkpoint ${id ?? "(none within 10 s)"}`);
      await delay(fault.inCheckpoint.offsetMs);
      if (!alive()) return;
    }
    const record: FaultRecord = { fault, label: describeFault(fault), startMs: Date.now() - t0 };
    records.push(record);
    logs.note(`fault ${record.label} begins`);
    try {
      record.outcome = await apply(world, fault, alive, logs);
    } catch (error) {
      record.outcome = `error: ${String(error)}`;
    }
    record.endMs = Date.now() - t0;
    logs.note(`fault ${record.label} ends: ${record.outcome}`);
  };
  const settled = Promise.all(faults.map(one)).then(() => undefined);
  return { records, settled, cancel: () => (cancelled = true) };
}

/** Each world's NATS restart under way: the next waits for it. */
const natsRestarts = new WeakMap<ChaosWorld, Promise<unknown>>();

async function apply(world: ChaosWorld, fault: Fault, alive: () => boolean, logs: ProcessLogs): Promise<string> {
  const track = (pid: number | undefined) => pid !== undefined && world.pids.add(pid);
  switch (fault.kind) {
    case "kill-leader":
      return world.coordinators.killLeader(world.client, fault.pauseMs, alive);
    case "stop-coordinator":
      return world.coordinators.pause(world.client, fault.target ?? "leader", fault.pauseMs);
    case "kill-gym-server":
    case "kill-gym": {
      const names = fault.kind === "kill-gym" ? world.gymServers : world.gymServers.filter((n) => n === fault.target);
      await world.gym.kill(names, "SIGKILL");
      logs.note(`SIGKILLed gym ${names.join(",")}`);
      await delay(fault.pauseMs);
      // Restarted always: a Gym left down would only prove the collector gives up after --run-timeout-s.
      // The launcher gives a restarted process its old port, so the collector's --run-url stays valid.
      if (!alive()) return "collection over, not restarted";
      await world.gym.start(world.gymServers);
      trackGym(world.gym, track);
      return `restarted ${names.join(",")}: ${[...world.gym.processes.values()].map((p) => `${p.name}=${p.url}`).join(" ")}`;
    }
    case "kill-collector":
      return world.collector.killAndRestart(fault.pauseMs);
    case "kill-collector-twice": {
      const first = await world.collector.killAndRestart(200);
      await delay(fault.pauseMs);
      return `${first}; ${await world.collector.killAndRestart(200)}`;
    }
    case "kill-node":
      // Both die together, as on a lost node; the Gym comes back before the collector, as a requeued job's would.
      return world.collector.killAndRestart(fault.pauseMs, async () => {
        await world.gym.kill(world.gymServers, "SIGKILL");
        logs.note("SIGKILLed gym model,resources,agent,environment with the collector");
        await world.gym.start(world.gymServers);
        trackGym(world.gym, track);
      });
    case "restart-nats": {
      // One at a time, as the collector's restarts: two overlapping would launch two servers on one port.
      const previous = natsRestarts.get(world) ?? Promise.resolve();
      const restart = previous.then(async () => {
        // Every process keeps reconnecting; JetStream (lease, members, journal) comes back from the store.
        const killed = world.nats.server.pid;
        await world.nats.server.kill();
        logs.note(`SIGKILLed nats-server pid ${killed}`);
        await delay(fault.pauseMs);
        // Started again even once the collection is over: the tear-down and the checks need it.
        await world.nats.server.restart();
        track(world.nats.server.pid);
        return `restarted nats-server as pid ${world.nats.server.pid} on ${world.nats.server.url}`;
      });
      natsRestarts.set(world, restart.catch(() => undefined));
      return restart;
    }
    case "usr1-collector":
      return world.collector.signal("SIGUSR1") ? "sent" : "collector not running";
  }
}

/** The id of the next checkpoint the collector prepares (a `{"checkpoint_id"}` line appended to its dispatch log, written before the prepare is sent). */
async function nextPrepare(log: string, alive: () => boolean): Promise<string | undefined> {
  const ids = async () => ((await readFile(log, "utf8").catch(() => "")).match(/"checkpoint_id":"[^"]*"/g) ?? []);
  const before = (await ids()).length;
  const until = Date.now() + 10_000;
  while (alive() && Date.now() < until) {
    const now = await ids();
    // A restarted collector rewrites the log (carrying old ids forward): a count that fell is a new log, wait on.
    if (now.length > before) return now.at(-1)!.slice(17, -1);
    await delay(20);
  }
  return undefined;
}
