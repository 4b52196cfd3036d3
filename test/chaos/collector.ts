// From dist/: its exitWithParent preload is resolved beside the module, and the node it starts cannot load the .ts one.
import { startChildProgram, type ChildProgram } from "../../dist/coordinator/local/child-program.js";
import { collectArgs } from "../support/collect-args.js";
import { CLI, delay } from "./coordinators.js";
import type { ProcessLogs } from "./process-logs.js";

/**
 * `gym-ckpt collect` as a process the faults SIGKILL and restart with the very same arguments: the
 * restarted one must carry on from `dispatched.jsonl` and `LATEST` (docs/collect.md, "After a crash
 * or requeue"). `finished` resolves with the exit of the collector that ended on its own.
 */
export class Collector {
  private starts = 0;
  private current?: ChildProgram;
  private restarting = false;
  private queue: Promise<unknown> = Promise.resolve();
  private resolveEnd!: (exit: { code: number | null; signal: NodeJS.Signals | null }) => void;
  /** The exit of the last collector not ended by the harness. */
  readonly finished = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => (this.resolveEnd = resolve));
  done = false;

  constructor(
    private readonly args: string[],
    private readonly logs: ProcessLogs,
    private readonly track: (pid: number | undefined) => void,
  ) {}

  static argsFor(o: { natsUrl: string; deployment: string; token: string; root: string; runUrl: string }): string[] {
    return collectArgs(o, [
      "--concurrency", "8",
      "--checkpoint-every", "2",
      "--checkpoint-timeout-s", "15",
      // Faults fail attempts (a Gym crash fails every row in flight): the budget is not what is tested.
      "--max-attempts", "20",
      "--run-timeout-s", "60",
      "--leader-wait-ms", "15000",
      "--progress-interval-s", "5",
      "--log-level", "info",
    ]);
  }

  async start(): Promise<void> {
    const n = ++this.starts;
    const name = `collector-${n}`;
    const program = await startChildProgram(CLI, this.args, { exitWithParent: true, onLine: (line, stream) => this.logs.line(name, line, stream) });
    this.track(program.child.pid);
    this.current = program;
    this.logs.note(`started ${name} pid ${program.child.pid}`);
    void program.exited.then((exit) => {
      this.logs.note(`${name} exited ${JSON.stringify(exit)}`);
      // A SIGKILL the harness sent is followed by a restart; any other exit ends the collection.
      if (this.current === program && !this.restarting) {
        this.done = true;
        this.resolveEnd(exit);
      }
    });
  }

  get running(): boolean {
    return !!this.current && this.current.child.exitCode === null && this.current.child.signalCode === null;
  }

  signal(signal: NodeJS.Signals): boolean {
    if (!this.running || this.done) return false;
    return this.current!.child.kill(signal);
  }

  /**
   * SIGKILL, `during` (e.g. the Gym's crash and restart), then the same command again after
   * `pauseMs`. One at a time: two overlapping faults must not start two collectors (the second
   * would be refused `checkpoint_conflict`, exit 1, and read as the collection's end).
   */
  killAndRestart(pauseMs: number, during?: () => Promise<void>): Promise<string> {
    const turn = this.queue.then(async () => {
      if (!this.running || this.done) return "collector not running";
      this.restarting = true;
      try {
        await this.current!.kill("SIGKILL");
        await during?.();
        await delay(pauseMs);
        await this.start();
      } finally {
        this.restarting = false;
      }
      return `restarted as collector-${this.starts}`;
    });
    this.queue = turn.catch(() => undefined);
    return turn;
  }

  get restarts(): number {
    return this.starts - 1;
  }

  /** The tear-down's SIGKILL: no restart follows. */
  async kill(): Promise<void> {
    this.restarting = true;
    await this.current?.kill("SIGKILL");
  }
}
