import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { makeDirectories } from "../../protocol/index.js";

/** Where Debian puts the binary; PATH is searched first. */
const CANDIDATE_BINARIES = ["nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server"];

export interface NatsServerOptions {
  /** JetStream store directory; a fresh temp directory when omitted. */
  storeDir?: string;
  /** Fixed port; a free one chosen by the server when omitted. */
  port?: number;
  /** Extra command-line arguments. */
  args?: string[];
  /** How long to wait for the server to listen. */
  startTimeoutMs?: number;
  /**
   * SIGKILL the server when this process dies, however it dies (nats-server cannot watch its parent
   * itself): it runs under `setpriv --pdeathsig KILL` (Linux, util-linux ≥ 2.33). Without setpriv
   * the server outlives a SIGKILLed parent. On by default: a test worker that crashed, or any
   * starter that never ran its dispose, would otherwise leave its server running with nobody to
   * stop it. The kernel acts when the thread that started the server ends: start it from the main
   * thread, or from a worker thread that outlives it. `false` lets it outlive this process.
   */
  exitWithParent?: boolean;
  /**
   * Called when the server exits without being asked to (not through stop, kill, restart or
   * dispose), with its exit and the end of its log: a test that loses its server says why.
   */
  onUnexpectedExit?: (exit: NatsServerExit) => void;
}

export interface NatsServerExit {
  pid: number | undefined;
  port: number;
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The last 4000 characters the server wrote to stderr. */
  log: string;
}

/**
 * A nats-server child process on 127.0.0.1 with JetStream, for the demo and the test suites.
 * It can be stopped, killed with SIGKILL and restarted on the same port and store.
 */
export class NatsServerProcess {
  private child: ChildProcess | undefined;
  private stderrTail = "";
  /** Set while a stop, kill or restart of ours is under way: the exit is expected then. */
  private signalling = false;
  /** How many times a server was started (restarts included): a connection made to an earlier one was dropped on purpose. */
  launches = 0;

  private constructor(
    readonly storeDir: string,
    private readonly ownsStore: boolean,
    public port: number,
    private readonly extraArgs: string[],
    private readonly startTimeoutMs: number,
    private readonly exitWithParent: boolean,
    private readonly onUnexpectedExit: ((exit: NatsServerExit) => void) | undefined,
  ) {}

  static async start(options: NatsServerOptions = {}): Promise<NatsServerProcess> {
    const ownsStore = options.storeDir === undefined;
    const storeDir = options.storeDir ?? (await mkdtemp(join(tmpdir(), "gym-ckpt-nats-")));
    for (let tries = 1; ; tries++) {
      const server = new NatsServerProcess(storeDir, ownsStore, options.port ?? (await portBelowEphemeralRange()), options.args ?? [], options.startTimeoutMs ?? 10_000, options.exitWithParent !== false, options.onUnexpectedExit);
      try {
        await server.launch();
        return server;
      } catch (error) {
        // A port we chose may be taken by another listener: choose again (a fixed one is the caller's).
        if (options.port === undefined && tries < 8 && /address already in use/.test(String(error))) continue;
        if (ownsStore) await rm(storeDir, { recursive: true, force: true });
        throw error;
      }
    }
  }

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.child?.pid;
  }

  /** The server process is up and not being stopped (started, not exited, no stop or kill of ours under way). */
  get running(): boolean {
    return !this.signalling && this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** The end of the server's stderr (its log), for diagnostics. */
  get log(): string {
    return this.stderrTail;
  }

  private async launch(): Promise<void> {
    const portsDir = join(this.storeDir, "ports");
    await rm(portsDir, { recursive: true, force: true });
    await makeDirectories(portsDir);
    const args = ["-a", "127.0.0.1", "-p", String(this.port), "-js", "-sd", join(this.storeDir, "js"), "--ports_file_dir", portsDir, ...this.extraArgs];
    // setpriv execs the server in its own process: the pid (and so the ports file name) is the server's.
    const setpriv = this.exitWithParent ? pdeathsigWrapper() : undefined;
    const child = setpriv
      ? spawn(setpriv, ["--pdeathsig", "KILL", "--", findBinary(), ...args], { stdio: ["ignore", "ignore", "pipe"] })
      : spawn(findBinary(), args, { stdio: ["ignore", "ignore", "pipe"] });
    this.child = child;
    this.launches++;
    this.stderrTail = "";
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      this.stderrTail = (this.stderrTail + chunk).slice(-4000);
    });
    const exited = new Promise<never>((_, reject) => {
      child.once("exit", (code, signal) => reject(new Error(`nats-server exited early (code ${code}, signal ${signal}): ${this.stderrTail}`)));
      child.once("error", reject);
    });
    exited.catch(() => undefined);
    const listening = this.waitForPortsFile(portsDir, child.pid!);
    try {
      this.port = await Promise.race([listening, exited]);
      child.once("exit", (code, signal) => {
        if (!this.signalling) this.onUnexpectedExit?.({ pid: child.pid, port: this.port, code, signal, log: this.stderrTail });
      });
    } catch (error) {
      // Nobody gets a handle to dispose of a server that never listened: do not leave it running.
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      throw error;
    }
  }

  /** The server writes `<exe>_<pid>.ports` once it listens; poll for it with a bounded budget. */
  private async waitForPortsFile(dir: string, pid: number): Promise<number> {
    const deadline = Date.now() + this.startTimeoutMs;
    while (Date.now() < deadline) {
      if (existsSync(dir)) {
        const file = (await readdir(dir)).find((name) => name.endsWith(`_${pid}.ports`));
        if (file) {
          // The server may still be writing the file: a partial read is retried on the next poll.
          const url = parsePortsFile(await readFile(join(dir, file), "utf8"));
          if (url) return Number(new URL(url).port);
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    throw new Error(`nats-server did not listen within ${this.startTimeoutMs} ms: ${this.stderrTail}`);
  }

  /** Graceful stop (SIGTERM), waiting for the process to exit. */
  async stop(): Promise<void> {
    await this.signal("SIGTERM");
  }

  /** Crash the server (SIGKILL). */
  async kill(): Promise<void> {
    await this.signal("SIGKILL");
  }

  /** Start again on the same port and JetStream store after stop or kill. */
  async restart(): Promise<void> {
    if (this.child && this.child.exitCode === null && this.child.signalCode === null) await this.stop();
    await this.launch();
  }

  /** Stop and remove the store directory if this launcher created it. */
  async dispose(): Promise<void> {
    await this.kill();
    if (this.ownsStore) await rm(this.storeDir, { recursive: true, force: true });
  }

  private async signal(signal: NodeJS.Signals): Promise<void> {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    this.signalling = true;
    try {
      child.kill(signal);
      await exited;
    } finally {
      this.signalling = false;
    }
  }
}

function parsePortsFile(text: string): string | undefined {
  try {
    return (JSON.parse(text) as { nats?: string[] }).nats?.[0];
  } catch {
    return undefined;
  }
}

function findBinary(): string {
  const found = findExecutable(CANDIDATE_BINARIES);
  if (!found) throw new Error("nats-server not found; install it with: sudo apt-get install -y nats-server");
  return found;
}

function findExecutable(candidates: string[]): string | undefined {
  for (const candidate of candidates) {
    if (!candidate.includes("/")) {
      for (const dir of (process.env.PATH ?? "").split(":")) {
        if (dir && existsSync(join(dir, candidate))) return join(dir, candidate);
      }
    } else if (existsSync(candidate)) {
      return candidate;
    }
  }
  return undefined;
}

let pdeathsig: string | null | undefined;

/** setpriv, when it is there and knows --pdeathsig (util-linux ≥ 2.33); looked up once. */
function pdeathsigWrapper(): string | undefined {
  if (pdeathsig === undefined) {
    const setpriv = findExecutable(["setpriv", "/usr/bin/setpriv"]);
    pdeathsig = setpriv && spawnSync(setpriv, ["--help"], { encoding: "utf8" }).stdout?.includes("--pdeathsig") ? setpriv : null;
  }
  return pdeathsig ?? undefined;
}

/**
 * A random port below the kernel's ephemeral range (-1, the server's own choice, if there is no
 * room). A port the server picks itself is ephemeral, and once it stops, an outgoing connection
 * can take it as its source port, so a restart on the same port fails to bind. Outgoing
 * connections never use ports below the range.
 */
async function portBelowEphemeralRange(): Promise<number> {
  const range = await readFile("/proc/sys/net/ipv4/ip_local_port_range", "utf8").catch(() => "32768 60999");
  const low = Number(range.trim().split(/\s+/)[0]);
  const floor = 10_000;
  if (!Number.isInteger(low) || low - floor < 1000) return -1;
  return floor + Math.floor(Math.random() * (low - floor));
}
