import { fileURLToPath } from "node:url";
// From dist/: its exitWithParent preload is resolved beside the module, and the node it starts cannot load the .ts one.
import { startChildProgram, type ChildProgram } from "../../dist/coordinator/local/child-program.js";
import type { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import type { ProcessLogs } from "./process-logs.js";

/**
 * The two coordinator daemons of a seed, as real processes so they can be SIGKILLed and SIGSTOPped.
 * Slots `a` and `b`; each (re)start gets a fresh `--coordinator-id` (`a1`, `a2`, …) so `status`
 * tells which process leads.
 */
export const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

export interface CoordinatorSettings {
  natsUrl: string;
  deployment: string;
  token: string;
  controllerToken: string;
  root: string;
  leaseMs: number;
}

interface Slot {
  name: "a" | "b";
  starts: number;
  id?: string;
  program?: ChildProgram;
  stopped: boolean;
}

export class CoordinatorPair {
  private readonly slots: Slot[] = [
    { name: "a", starts: 0, stopped: false },
    { name: "b", starts: 0, stopped: false },
  ];

  constructor(
    private readonly settings: CoordinatorSettings,
    private readonly logs: ProcessLogs,
    private readonly track: (pid: number | undefined) => void,
  ) {}

  async startAll(): Promise<void> {
    for (const slot of this.slots) await this.start(slot);
  }

  private async start(slot: Slot): Promise<void> {
    slot.starts++;
    const id = `${slot.name}${slot.starts}`;
    const s = this.settings;
    const args = [
      "coordinator",
      "--deployment", s.deployment,
      "--nats-url", s.natsUrl,
      "--token", s.token,
      "--controller-token", s.controllerToken,
      "--checkpoint-root", s.root,
      "--lease-ms", String(s.leaseMs),
      "--default-timeout-ms", "10000",
      "--coordinator-id", id,
      "--no-http",
      "--log-level", "info",
    ];
    const name = `coord-${id}`;
    // exitWithParent: a harness that dies anyhow (SIGKILL included) takes its coordinators along.
    const program = await startChildProgram(CLI, args, { exitWithParent: true, onLine: (line, stream) => this.logs.line(name, line, stream) });
    this.track(program.child.pid);
    slot.id = id;
    slot.program = program;
    slot.stopped = false;
    this.logs.note(`started coordinator ${id} pid ${program.child.pid}`);
    void program.exited.then((exit) => this.logs.note(`coordinator ${id} exited ${JSON.stringify(exit)}`));
  }

  /** The slot whose process leads now, per the ready leader's `status`; undefined when none answers within `waitMs`. */
  async leader(client: NatsControllerClient): Promise<Slot | undefined> {
    try {
      const status = await client.status();
      return this.slots.find((s) => s.id === status.coordinator.id);
    } catch {
      return undefined;
    }
  }

  private live(): Slot[] {
    return this.slots.filter((s) => s.program && s.program.child.exitCode === null && s.program.child.signalCode === null);
  }

  /** SIGKILL the leader (or, when none answers, a live coordinator), restart it after `pauseMs`. */
  async killLeader(client: NatsControllerClient, pauseMs: number, alive: () => boolean): Promise<string> {
    const slot = (await this.leader(client)) ?? this.live()[0];
    if (!slot?.program) return "no coordinator running";
    const id = slot.id;
    await slot.program.kill("SIGKILL");
    this.logs.note(`SIGKILLed coordinator ${id}`);
    await delay(pauseMs);
    if (alive()) await this.start(slot);
    return `killed ${id}`;
  }

  /** SIGSTOP the leader or the other one for `pauseMs`, then SIGCONT. */
  async pause(client: NatsControllerClient, which: string, pauseMs: number): Promise<string> {
    const leader = await this.leader(client);
    const live = this.live().filter((s) => !s.stopped);
    const slot = which === "leader" ? (leader ?? live[0]) : (live.find((s) => s !== leader) ?? live[0]);
    if (!slot?.program) return "no coordinator running";
    const child = slot.program.child;
    slot.stopped = true;
    child.kill("SIGSTOP");
    this.logs.note(`SIGSTOPped coordinator ${slot.id} (${which})`);
    await delay(pauseMs);
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGCONT");
    slot.stopped = false;
    this.logs.note(`SIGCONTed coordinator ${slot.id}`);
    return `paused ${slot.id}`;
  }

  async killAll(): Promise<void> {
    await Promise.allSettled(
      this.slots.map(async (s) => {
        s.program?.child.kill("SIGCONT"); // a stopped process dies of SIGKILL anyway; CONT so its pipes drain
        await s.program?.kill("SIGKILL");
      }),
    );
  }
}

export const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
