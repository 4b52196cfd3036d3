import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { join } from "node:path";
import { DEFAULT_NATS_CONNECT_WAIT_MS, MAX_NATS_CONNECT_WAIT_MS } from "../../protocol/nats-first-connect.js";

/**
 * Starts the reference Gym as child processes, each on loopback with a free port and as soon as the
 * ones it calls are ready: policy backend → model attach proxy, with resources beside them, then
 * agent → environment. Each process prints a JSON ready line (`{"ready":true,...,"url"}`) that the
 * launcher waits for. Any subset can be killed (SIGKILL for crash tests) and started again;
 * restarted processes get the current URLs of the ones they call. `stop()` ends every process it
 * started.
 *
 * A restarted process gets its previous port back, so the running processes that call it keep a
 * valid URL. If that port stays taken, it moves to a free one and its running callers restart.
 */
export const GYM_PROCESSES = ["policy", "model", "resources", "agent", "environment"] as const;
export type GymProcessName = (typeof GYM_PROCESSES)[number];

export interface GymLaunchOptions {
  nats: string;
  deployment: string;
  /** Control-plane bearer token of the participants. */
  token: string;
  checkpointRoot?: string;
  leaseGraceSeconds?: number;
  /** Directory holding the compiled `participants/` tree (default: the one beside this module, or dist/ when run from source). */
  participantsDir?: string;
  /** Instance names (default: policy_backend, policy_model, resources, agent, environment). */
  instances?: Partial<Record<GymProcessName, string>>;
  /** Extra flags per process, e.g. `{ policy: ["--token-delay-ms", "5"], resources: ["--verify", "wait"] }`. */
  args?: Partial<Record<GymProcessName, string[]>>;
  /** Processes already running elsewhere (e.g. a real inference backend): their URLs; the launcher never starts them. */
  external?: Partial<Record<GymProcessName, string>>;
  /** Which processes to start now (default: all); start the rest later with `start(names)`. */
  initial?: readonly GymProcessName[];
  /**
   * How long a process may take to print its ready line (default: 10 s more than the servers' wait for
   * NATS, GYM_CKPT_NATS_CONNECT_WAIT_MS in `env` or this process's environment, default 10 s: 20 s).
   */
  readyTimeoutMs?: number;
  /** Every output line of every child (logs are JSON lines from pino). */
  onOutput?: (name: GymProcessName, line: string) => void;
  env?: NodeJS.ProcessEnv;
  /** Aborting stops the start-up: the processes being started and every one started so far are ended. */
  signal?: AbortSignal;
}

export interface GymProcess {
  name: GymProcessName;
  instance: string;
  pid: number;
  url: string;
  /** From the ready line, when the process serves Prometheus `/metrics`. */
  metricsUrl?: string;
  child: ChildProcess;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

export interface Gym {
  readonly urls: Partial<Record<GymProcessName, string>>;
  readonly processes: Map<GymProcessName, GymProcess>;
  readonly instances: Record<GymProcessName, string>;
  /**
   * (Re)starts the named processes that are not running, each once the ones it calls are ready (those
   * not calling each other side by side). A call made while another start or a stop() is under way
   * waits for it first.
   */
  start(names?: readonly GymProcessName[]): Promise<void>;
  /** Sends `signal` (default SIGKILL) and waits until each process exited. */
  kill(names: readonly GymProcessName[], signal?: NodeJS.Signals): Promise<void>;
  /** Ends every process: SIGTERM, then SIGKILL after a grace period. */
  stop(): Promise<void>;
}

const DEFAULT_INSTANCES: Record<GymProcessName, string> = {
  policy: "policy_backend",
  model: "policy_model",
  resources: "resources",
  agent: "agent",
  environment: "environment",
};

/** Who calls whom: a process that moves to another port restarts its running callers. */
const CALLERS: Record<GymProcessName, GymProcessName[]> = {
  policy: ["model"],
  model: ["agent"],
  resources: ["agent", "environment"],
  agent: ["environment"],
  environment: [],
};

/** Whether `from`'s callers include `to`, directly or through another process. */
function reaches(from: GymProcessName, to: GymProcessName): boolean {
  return CALLERS[from].some((caller) => caller === to || reaches(caller, to));
}

/** A process's start-up past its wait for NATS (joining as a participant, listening), in the default ready timeout. */
const READY_MARGIN_MS = 10_000;

/**
 * The default ready timeout: the servers' wait for a NATS server that does not accept connections
 * yet (GYM_CKPT_NATS_CONNECT_WAIT_MS, as each server reads it; a value it refuses ends it at once),
 * plus READY_MARGIN_MS. A fixed 20 s would cut a longer wait short: a Gym started before its NATS would fail
 * "did not print its ready line in time" while its servers still wait as told.
 */
export function defaultReadyTimeoutMs(env: NodeJS.ProcessEnv): number {
  const wait = env.GYM_CKPT_NATS_CONNECT_WAIT_MS;
  const connectWait = wait && /^\d+$/.test(wait) && Number(wait) <= MAX_NATS_CONNECT_WAIT_MS ? Number(wait) : DEFAULT_NATS_CONNECT_WAIT_MS;
  return connectWait + READY_MARGIN_MS;
}

/** Tries on the previous port before moving to a new one (the old socket may linger briefly). */
const SAME_PORT_TRIES = 5;

/** Set for the servers the launcher starts: each stops once the launcher is gone (its stdin's EOF; server-runtime.ts). */
export const STOP_WITH_LAUNCHER_ENV = "GYM_CKPT_STOP_WITH_LAUNCHER";

const ENTRIES: Record<GymProcessName, string> = {
  policy: "gym/policy-backend/main.js",
  model: "attach/main.js",
  resources: "gym/resources-server/main.js",
  agent: "gym/agent-server/main.js",
  environment: "gym/environment-server/main.js",
};

function defaultParticipantsDir(): string {
  const here = fileURLToPath(new URL("..", import.meta.url));
  // From source (tsx, vitest) the compiled tree lives in dist/.
  return import.meta.url.endsWith(".ts") ? join(here, "..", "dist", "participants") : here;
}

/** One start() call: the stop() generation it began in, its first failure and the processes it started. */
interface StartCall {
  generation: number;
  failure?: { error: unknown };
  started: GymProcess[];
}

/** The child exited before its ready line; `exitCode` 2 is a configuration it refused (docs/operations.md: not restarted). */
export class ExitedBeforeReady extends Error {
  constructor(
    message: string,
    readonly exitCode: number | null,
  ) {
    super(message);
  }
}

/** The child exited before its ready line because its port was taken. */
class PortInUse extends ExitedBeforeReady {}

/** Whether a process's last lines say `port` itself was taken (`:4000`, not the `:40001` of its metrics port). */
export function namesTakenPort(lines: readonly string[], port: number): boolean {
  const named = new RegExp(`:${port}(?!\\d)`);
  return lines.some((line) => line.includes("EADDRINUSE") && named.test(line));
}

export async function launchGym(options: GymLaunchOptions): Promise<Gym> {
  const dir = options.participantsDir ?? defaultParticipantsDir();
  const instances = { ...DEFAULT_INSTANCES, ...options.instances };
  const urls: Partial<Record<GymProcessName, string>> = {};
  const processes = new Map<GymProcessName, GymProcess>();
  const ports: Partial<Record<GymProcessName, number>> = {};
  const starting = new Set<ChildProcess>();
  /**
   * Counts the stop() calls: a start that began before one starts nothing after it (its retries on a
   * taken port and the restarts of the callers of a process that moved would otherwise go on).
   */
  let stops = 0;
  const { signal } = options;
  Object.assign(urls, options.external);

  // One inherited OTEL_EXPORTER_PROMETHEUS_PORT would make every child bind the same port: each
  // gets `--metrics-port` instead, base + its index in GYM_PROCESSES (0 stays "any free port").
  // The token and the NATS servers (whose URLs may carry a password or a `?token=`) travel in the
  // environment, not argv: any local user can read /proc/<pid>/cmdline.
  const env: NodeJS.ProcessEnv = { ...process.env, ...options.env, GYM_CKPT_TOKEN: options.token, GYM_CKPT_NATS_URL: options.nats };
  const prometheusBase = env.OTEL_EXPORTER_PROMETHEUS_PORT;
  delete env.OTEL_EXPORTER_PROMETHEUS_PORT;
  const metricsFlags = (name: GymProcessName): string[] => {
    if (!prometheusBase) return [];
    const base = Number(prometheusBase);
    // Anything but a positive integer goes through as given, for the child to refuse.
    const port = Number.isInteger(base) && base > 0 ? String(base + GYM_PROCESSES.indexOf(name)) : prometheusBase;
    return ["--metrics-port", port];
  };

  const common = (name: GymProcessName, port: number) => [
    "--deployment",
    options.deployment,
    "--instance",
    instances[name],
    "--port",
    String(port),
    ...(options.checkpointRoot ? ["--checkpoint-root", options.checkpointRoot] : []),
    ...(options.leaseGraceSeconds !== undefined ? ["--lease-grace-seconds", String(options.leaseGraceSeconds)] : []),
    ...metricsFlags(name),
  ];
  const need = (name: GymProcessName, of: GymProcessName): string => {
    const url = urls[of];
    if (!url) throw new Error(`${name} needs the ${of} URL; start ${of} first`);
    return url;
  };
  const argsFor = (name: GymProcessName, port: number): string[] => {
    const own = options.args?.[name] ?? [];
    switch (name) {
      case "policy":
        return [...common(name, port), ...own];
      case "model":
        return ["--upstream", need(name, "policy"), ...common(name, port), ...own];
      case "resources":
        return [...common(name, port), ...own];
      case "agent":
        return [...common(name, port), "--policy-url", need(name, "model"), "--resources-url", need(name, "resources"), ...own];
      case "environment":
        return [...common(name, port), "--agent-url", need(name, "agent"), "--resources-url", need(name, "resources"), ...own];
    }
  };
  const aborted = () => new Error(`gym start-up aborted${signal?.reason instanceof Error ? `: ${signal.reason.message}` : ""}`);

  const stopped = (name: GymProcessName) => new Error(`gym stopped while ${name} was starting`);
  const startOne = async (name: GymProcessName, port: number, call: StartCall): Promise<void> => {
    const { generation } = call;
    if (signal?.aborted) throw aborted();
    if (stops !== generation) throw stopped(name);
    // Another start of this call failed: it is about to throw, so nothing more starts.
    if (call.failure) throw new Error(`${name} not started: another start failed`);
    const entry = join(dir, ENTRIES[name]);
    if (!existsSync(entry)) throw new Error(`${entry} is missing; run \`npm run build\` first`);
    // stdin: a pipe never written to, whose EOF stops the server once this process is gone (STOP_WITH_LAUNCHER_ENV).
    const child = spawn(process.execPath, [entry, ...argsFor(name, port)], {
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...env, [STOP_WITH_LAUNCHER_ENV]: "1" },
    });
    child.stdin!.on("error", () => undefined); // never written; closed when the child exits
    starting.add(child);
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
    // After "close" every output line has been read, so the tail shows why it died.
    const closed = new Promise<void>((resolve) => child.once("close", () => resolve()));
    const tail: string[] = [];
    const remember = (line: string) => {
      tail.push(line);
      if (tail.length > 20) tail.shift();
      options.onOutput?.(name, line);
    };
    createInterface({ input: child.stderr! }).on("line", remember);
    let onAbort: (() => void) | undefined;
    const ready = new Promise<{ url: string; metricsUrl?: string }>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${name} did not print its ready line in time:\n${tail.join("\n")}`)), options.readyTimeoutMs ?? defaultReadyTimeoutMs(env));
      onAbort = () => {
        clearTimeout(timer);
        reject(aborted());
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      createInterface({ input: child.stdout! }).on("line", (line) => {
        remember(line);
        if (!line.startsWith("{")) return;
        try {
          const parsed = JSON.parse(line) as { ready?: unknown; url?: unknown; metrics_url?: unknown };
          if (parsed.ready === true && typeof parsed.url === "string") {
            clearTimeout(timer);
            resolve({ url: parsed.url, ...(typeof parsed.metrics_url === "string" && { metricsUrl: parsed.metrics_url }) });
          }
        } catch {
          // an ordinary log line
        }
      });
      void closed.then(() => {
        clearTimeout(timer);
        const { exitCode: code, signalCode } = child;
        const message = `${name} exited (code ${code}, signal ${signalCode}) before it was ready:\n${tail.join("\n")}`;
        const portTaken = port !== 0 && namesTakenPort(tail, port);
        reject(portTaken ? new PortInUse(message, code) : new ExitedBeforeReady(message, code));
      });
    });
    let announced: { url: string; metricsUrl?: string };
    try {
      announced = await ready;
    } catch (error) {
      child.kill("SIGKILL");
      await exited;
      throw error;
    } finally {
      starting.delete(child);
      if (onAbort) signal?.removeEventListener("abort", onAbort);
    }
    // Ready just as a stop came: that stop did not see it, so it is ended here.
    if (stops !== generation) {
      child.kill("SIGKILL");
      await exited;
      throw stopped(name);
    }
    const { url } = announced;
    urls[name] = url;
    ports[name] = Number(new URL(url).port);
    const started: GymProcess = { name, instance: instances[name], pid: child.pid!, ...announced, child, exited };
    processes.set(name, started);
    call.started.push(started);
    void exited.then(() => {
      if (processes.get(name)?.child === child) processes.delete(name);
    });
  };

  const terminate = async (p: GymProcess): Promise<void> => {
    p.child.kill("SIGTERM");
    const timer = setTimeout(() => p.child.kill("SIGKILL"), 5000);
    await p.exited;
    clearTimeout(timer);
    if (processes.get(p.name) === p) processes.delete(p.name);
  };

  /**
   * Two processes started side by side may both move and share callers (agent, environment): the
   * callers' restarts run one moved process at a time, each reading the URLs the previous one left.
   */
  let restarts: Promise<unknown> = Promise.resolve();

  // A process that ran before comes back on its port: its running callers still hold that URL.
  const startAgain = async (name: GymProcessName, call: StartCall, restarting = false): Promise<void> => {
    const previous = ports[name];
    if (previous !== undefined) {
      for (let attempt = 0; attempt < SAME_PORT_TRIES; attempt++) {
        try {
          return await startOne(name, previous, call);
        } catch (error) {
          if (!(error instanceof PortInUse)) throw error;
          if (attempt < SAME_PORT_TRIES - 1) await new Promise((resolve) => setTimeout(resolve, 100 * 2 ** attempt));
        }
      }
    }
    await startOne(name, 0, call);
    if (previous === undefined) return;
    if (restarting) return restartCallers(name, call);
    const turn = restarts.then(() => restartCallers(name, call));
    restarts = turn.catch(() => undefined);
    await turn;
  };
  // It moved: restart the running callers so they get its new URL.
  const restartCallers = async (name: GymProcessName, call: StartCall): Promise<void> => {
    for (const caller of GYM_PROCESSES) {
      const running = processes.get(caller);
      if (!CALLERS[name].includes(caller) || !running) continue;
      if (stops !== call.generation) throw stopped(caller);
      // After a failure in this call no caller is ended for a restart that would not begin.
      if (call.failure) return;
      await terminate(running);
      await startAgain(caller, call, true);
    }
  };

  const startNow = async (names: readonly GymProcessName[], generation: number): Promise<void> => {
    // Overtaken by a stop() while it waited: rejected as its starts would be, even when none is
    // needed (its names external), so a caller never takes a stopped gym for a started one.
    if (stops !== generation) throw new Error(`gym stopped before this start began (${names.join(", ")})`);
    const call: StartCall = { generation, started: [] };
    const starts = new Map<GymProcessName, Promise<void>>();
    for (const name of GYM_PROCESSES) {
      if (!names.includes(name) || options.external?.[name]) continue;
      // It waits for every one started here that it calls, even through a process not started
      // here: that one's start may move it and restart the process in between.
      const first = [...starts].filter(([other]) => reaches(other, name)).map(([, task]) => task);
      const started = (async () => {
        await Promise.allSettled(first);
        // After a failure nothing more starts, as when they started one by one.
        if (call.failure || processes.has(name)) return;
        try {
          await startAgain(name, call);
        } catch (error) {
          call.failure ??= { error };
        }
      })();
      starts.set(name, started);
    }
    // The starts under way finish (none begins after the failure), then every process this call
    // started is ended before the first failure is thrown: nothing it began runs on unknown to its
    // caller (a moved process, a caller restarted with its URL).
    await Promise.allSettled(starts.values());
    if (!call.failure) return;
    await Promise.all(call.started.reverse().map(terminate));
    throw call.failure.error;
  };

  /**
   * The start() calls run one at a time: two side by side would both spawn a process not running
   * yet (one left running that the map no longer holds) and move each other's ports. A later one
   * waits for the one under way, then starts those of its names still not running; a stop() while
   * it waits ends it too (its generation is taken when it is called).
   */
  let lastStart: Promise<unknown> = Promise.resolve();
  /**
   * The stop() calls under way. A start waits for them: begun beside one, it would skip the
   * processes that stop is still ending (they are in the map until it clears it), and that clear
   * would drop a process it started, left running unknown to every later stop().
   */
  let stopping: Promise<unknown> = Promise.resolve();

  const gym: Gym = {
    urls,
    processes,
    instances,
    start(names = GYM_PROCESSES) {
      const generation = stops;
      const run = lastStart.then(() => stopping).then(() => startNow(names, generation));
      lastStart = run.catch(() => undefined);
      return run;
    },
    async kill(names, signal = "SIGKILL") {
      const targets = names.map((n) => processes.get(n)).filter((p): p is GymProcess => p !== undefined);
      for (const p of targets) p.child.kill(signal);
      await Promise.all(targets.map((p) => p.exited));
      for (const p of targets) if (processes.get(p.name) === p) processes.delete(p.name);
    },
    async stop() {
      stops += 1;
      // One still starting fails its start-up once killed.
      for (const child of starting) child.kill("SIGKILL");
      const ending = Promise.all([...processes.values()].reverse().map(terminate)).then(() => processes.clear());
      // A stop that failed must not fail every later start: that stop's caller sees its failure.
      stopping = Promise.all([stopping, ending.catch(() => undefined)]);
      await ending;
    },
  };
  try {
    await gym.start(options.initial ?? GYM_PROCESSES);
  } catch (error) {
    await gym.stop();
    throw error;
  }
  return gym;
}
