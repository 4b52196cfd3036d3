import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { ProcessGroup } from "./process-group.js";

export interface ChildProgram {
  child: ChildProcess;
  /** The parsed JSON ready line (`{"ready":true,…}`), when waited for. */
  ready: Record<string, unknown> | undefined;
  /** Resolves once the process exited and its output was read (at most OUTPUT_AFTER_EXIT_MS after the exit); code and signal null if it could not be started. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** SIGKILL the process (and, with `group`, every process it started). */
  kill(signal?: NodeJS.Signals): Promise<void>;
}

export interface ChildProgramOptions {
  /** Wait for a `{"ready":true}` JSON line on stdout. */
  waitReady?: boolean;
  readyTimeoutMs?: number;
  /** Own process group, so `kill` reaches its children too. */
  group?: boolean;
  /** Every output line (stdout and stderr) except the ready line. */
  onLine?: (line: string, stream: "stdout" | "stderr") => void;
  env?: NodeJS.ProcessEnv;
  /**
   * The program stops (as on SIGTERM) once this process is gone, however it ended, SIGKILL
   * included: its stdin is a pipe from here, and exit-with-parent.ts, preloaded, acts on its EOF.
   * Needs `node --import` (Node 20.6); on an older Node the program is started without it.
   */
  exitWithParent?: boolean;
  /**
   * Aborting while the ready line is awaited kills the program (with `group`, its whole group) and
   * rejects at once: a clean-up must not wait for a start it is about to undo (one that can never
   * get ready, its NATS gone, would hold it until the ready timeout).
   */
  signal?: AbortSignal;
}

/** How long `exited` waits, after the exit, for the program's output pipes to close. */
const OUTPUT_AFTER_EXIT_MS = 1_000;

const EXIT_WITH_PARENT = new URL(`./exit-with-parent${import.meta.url.endsWith(".ts") ? ".ts" : ".js"}`, import.meta.url).href;

/**
 * What starts a node program that stops once this process is gone (see `exitWithParent`): the
 * preload before its script, and a stdin pipe to keep open. Nothing where `--import` is missing.
 */
export function parentWatch(): { nodeArgs: string[]; stdin: "pipe" } | undefined {
  return process.allowedNodeEnvironmentFlags.has("--import") ? { nodeArgs: ["--import", EXIT_WITH_PARENT], stdin: "pipe" } : undefined;
}

/** Starts `node <script> …args` and optionally waits for its ready line. */
export async function startChildProgram(script: string, args: string[], options: ChildProgramOptions = {}): Promise<ChildProgram> {
  const watch = options.exitWithParent === true ? parentWatch() : undefined;
  const child = spawn(process.execPath, [...(watch?.nodeArgs ?? []), script, ...args], {
    stdio: [watch?.stdin ?? "ignore", "pipe", "pipe"],
    detached: options.group === true,
    env: { ...process.env, ...options.env },
  });
  // Read now, while the leader surely lives: what tells its group from a later one with its number.
  const group = options.group === true && child.pid !== undefined ? new ProcessGroup(child.pid) : undefined;
  // 'exit' can come before the last output lines are read (a loaded machine): wait for the pipes to
  // close too, so a caller that reports the output on exit has all of it. Bounded, since a process
  // the program started may hold them open.
  let spawnError: Error | undefined;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once("exit", (code, signal) => {
      const done = () => resolve({ code, signal });
      const timer = setTimeout(done, OUTPUT_AFTER_EXIT_MS);
      timer.unref();
      child.once("close", () => {
        clearTimeout(timer);
        done();
      });
    });
    // A spawn that failed (EAGAIN, EMFILE, ENFILE, ENOENT) emits 'error' and never 'exit'; unheard,
    // it would crash this process. Another 'error' (a kill refused) leaves a running child: its exit comes.
    child.on("error", (error) => {
      if (child.pid !== undefined) return;
      spawnError = error;
      resolve({ code: null, signal: null });
    });
  });
  child.stdin?.on("error", () => undefined); // never written; closed when the child exits
  const tail: string[] = [];
  let resolveReady: ((value: Record<string, unknown>) => void) | undefined;
  const onLine = (stream: "stdout" | "stderr") => (line: string) => {
    if (resolveReady && stream === "stdout" && line.startsWith("{")) {
      try {
        const parsed = JSON.parse(line) as Record<string, unknown>;
        if (parsed.ready === true) {
          resolveReady(parsed);
          resolveReady = undefined;
          return;
        }
      } catch {
        // not the ready line
      }
    }
    tail.push(line);
    if (tail.length > 30) tail.shift();
    options.onLine?.(line, stream);
  };
  createInterface({ input: child.stdout! }).on("line", onLine("stdout"));
  createInterface({ input: child.stderr! }).on("line", onLine("stderr"));

  const kill = async (signal: NodeJS.Signals = "SIGKILL") => {
    // A group is signalled even after its leader exited: what it started may outlive it.
    if (group) group.signal(signal);
    else if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    await exited;
  };

  let ready: Record<string, unknown> | undefined;
  if (options.waitReady) {
    const { signal: abort } = options;
    let onAbort: (() => void) | undefined;
    ready = await new Promise<Record<string, unknown>>((resolve, reject) => {
      resolveReady = resolve;
      const timer = setTimeout(() => reject(new Error(`${script} printed no ready line within ${options.readyTimeoutMs ?? 30_000} ms:\n${tail.join("\n")}`)), options.readyTimeoutMs ?? 30_000);
      timer.unref();
      void exited.then(({ code, signal }) =>
        reject(spawnError ? new Error(`${script} could not be started: ${spawnError.message}`, { cause: spawnError }) : new Error(`${script} exited (code ${code}, signal ${signal}) before it was ready:\n${tail.join("\n")}`)),
      );
      onAbort = () => reject(new Error(`${script} start aborted`));
      if (abort?.aborted) onAbort();
      else abort?.addEventListener("abort", onAbort, { once: true });
    })
      .catch(async (error: unknown) => {
        await kill();
        throw error;
      })
      .finally(() => onAbort && abort?.removeEventListener("abort", onAbort));
  }
  return { child, ready, exited, kill };
}
