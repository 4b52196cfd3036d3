import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { launchGym, type Gym, type GymProcessName } from "../../participants/gym/gym-launcher.js";
import { CONTROLLER_TOKEN, GYM_SERVERS, GYM_TOKEN } from "../support/gym-processes.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { Collector } from "./collector.js";
import { CoordinatorPair } from "./coordinators.js";
import type { ProcessLogs } from "./process-logs.js";

/**
 * One seed's world: nats-server on a free loopback port with a temp store, two coordinator daemons
 * on a short lease (so a kill or a pause fails over), the reference Gym (policy backend, model
 * attach proxy, resources, agent, environment) started by this process, and the collector over
 * `rows` short rows. Every pid ever spawned is remembered, so the end can prove none survived.
 */
export const LEASE_MS = 1000;

export interface ChaosWorld {
  root: string;
  deployment: string;
  rows: string[];
  nats: NatsFixture;
  coordinators: CoordinatorPair;
  gym: Gym;
  collector: Collector;
  client: NatsControllerClient;
  pids: Set<number>;
  /** Gym servers to kill/restart; the policy backend plays the inference server and survives. */
  gymServers: readonly Exclude<GymProcessName, "policy">[];
  /** The environment's URL the collector's --run-url was built from. */
  runUrlBase: string;
  close(): Promise<void>;
}

export async function startChaosWorld(seed: number, root: string, rowCount: number, logs: ProcessLogs, register: (close: () => Promise<void>) => void): Promise<ChaosWorld> {
  await mkdir(root, { recursive: true });
  const deployment = `chaos${process.pid}s${seed}`;
  const pids = new Set<number>();
  const track = (pid: number | undefined) => pid !== undefined && pids.add(pid);
  const closers: (() => Promise<void>)[] = [];
  // Registered before each start, so a failure (or Ctrl-C) part way still closes what did start.
  const close = async () => {
    for (const c of closers.splice(0).reverse()) await c().catch((error) => logs.note(`close failed: ${String(error)}`));
  };
  register(close);

  // exitWithParent: a harness that dies anyhow (SIGKILL included) takes its nats-server along.
  const nats = await startNats({ exitWithParent: true });
  closers.push(() => nats.close());
  track(nats.server.pid);
  logs.note(`nats-server ${nats.server.url} pid ${nats.server.pid}`);

  const coordinators = new CoordinatorPair(
    { natsUrl: nats.server.url, deployment, token: GYM_TOKEN, controllerToken: CONTROLLER_TOKEN, root, leaseMs: LEASE_MS },
    logs,
    track,
  );
  closers.push(() => coordinators.killAll());
  await coordinators.startAll();

  let gym: Gym | undefined;
  closers.push(async () => gym?.stop());
  await mkdir(join(root, "model-ledger"), { recursive: true });
  gym = await launchGym({
    nats: nats.server.url,
    deployment,
    token: GYM_TOKEN,
    checkpointRoot: root,
    leaseGraceSeconds: 60,
    // A few ms per streamed token keeps model calls in flight across checkpoints and crashes.
    args: { model: ["--ledger-dir", join(root, "model-ledger")], policy: ["--token-delay-ms", "80"] },
    onOutput: (name, line) => logs.line(`gym-${name}`, line),
  });
  trackGym(gym, track);

  const rows = Array.from({ length: rowCount }, (_, i) => `r${i}`);
  await writeFile(join(root, "tasks.jsonl"), `${rows.map((id, i) => JSON.stringify({ id, task: { expression: `${i} + 1`, tool_rounds: 1 + (i % 2) } })).join("\n")}\n`);

  const client = new NatsControllerClient({ nc: await nats.connect(), deployment, token: CONTROLLER_TOKEN, leaderWaitMs: 3000, slackMs: 2000 });
  const collector = new Collector(
    Collector.argsFor({ natsUrl: nats.server.url, deployment, token: CONTROLLER_TOKEN, root, runUrl: `${gym.urls.environment!.replace(/\/+$/, "")}/run` }),
    logs,
    track,
  );
  closers.push(() => collector.kill());
  return { root, deployment, rows, nats, coordinators, gym, collector, client, pids, gymServers: GYM_SERVERS, runUrlBase: gym.urls.environment!, close };
}

/** Remembers the pid of every Gym process running now (called after each (re)start). */
export function trackGym(gym: Gym, track: (pid: number | undefined) => void): void {
  for (const p of gym.processes.values()) track(p.pid);
}
