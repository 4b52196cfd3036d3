import { execFile, execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { promisify } from "node:util";
import { CONTROLLER_TOKEN, PARTICIPANT_TOKEN, type World } from "../integration/coordinator-harness.js";

export const MAIN = "dist/coordinator/cli/main.js";

/** Builds dist once when it is missing (`npm test` builds before vitest). */
export function ensureBuilt(): void {
  if (existsSync(MAIN)) return;
  try {
    execFileSync("npx", ["tsc", "-p", "tsconfig.build.json"], { stdio: "ignore" });
  } catch {
    // type errors elsewhere still emit JavaScript
  }
  if (!existsSync(MAIN)) throw new Error(`${MAIN} is missing after the build`);
}

export function daemonArgs(world: World, extra: string[] = []): string[] {
  return [
    MAIN,
    "coordinator",
    "--deployment",
    world.deployment,
    "--nats-url",
    world.nats.server.url,
    "--token",
    PARTICIPANT_TOKEN,
    "--controller-token",
    CONTROLLER_TOKEN,
    "--checkpoint-root",
    world.root,
    "--lease-ms",
    "500",
    "--default-timeout-ms",
    "5000",
    "--log-level",
    "warn",
    ...extra,
  ];
}

export interface DaemonProcess {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): Promise<void>;
}

/**
 * A command prefix that runs a program as another account the way a service manager would: `uid`,
 * primary group `gid`, supplementary `groups` only, and `umask` (setpriv needs root).
 */
export function asAccount(account: { uid: number; gid: number; groups?: number[]; umask: number }): string[] {
  const groups = account.groups?.length ? [`--groups=${account.groups.join(",")}`] : ["--clear-groups"];
  const umask = account.umask.toString(8).padStart(4, "0");
  return ["setpriv", `--reuid=${account.uid}`, `--regid=${account.gid}`, ...groups, "sh", "-c", `umask ${umask} && exec "$@"`, "sh"];
}

/**
 * Spawns `gym-ckpt coordinator` as a real process (behind `prefix`, e.g. `asAccount(...)`); `kill`
 * is safe to call in teardown.
 */
export function spawnDaemon(args: string[], env: Record<string, string> = {}, prefix: string[] = []): DaemonProcess {
  const [command, ...rest] = [...prefix, process.execPath, ...args];
  const child = spawn(command!, rest, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  return {
    child,
    stdout: () => out,
    stderr: () => err,
    exited,
    async kill(signal: NodeJS.Signals = "SIGKILL") {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      await exited;
    },
  };
}

const execFileAsync = promisify(execFile);

/** What `cli` answers for a command that did not exit by itself (killed after 30 s, or never started): no code a command exits with. */
export const CLI_NO_EXIT = -1;

/**
 * Runs the built CLI without blocking the event loop (in-process participants must keep answering).
 * Bounded by a SIGKILL of its own after 30 s: execFile's `timeout` sends SIGTERM, and a command
 * whose handler then exits 0 (the coordinator daemon) read as a success, one killed by it as exit 1.
 */
export async function cli(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  const run = execFileAsync(process.execPath, [MAIN, ...args], { env: { ...process.env, ...env } });
  let timedOut = false;
  const bound = setTimeout(() => {
    timedOut = true;
    run.child.kill("SIGKILL");
  }, 30_000);
  try {
    const { stdout, stderr } = await run;
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code?: number | string | null; signal?: NodeJS.Signals | null; stdout?: string; stderr?: string };
    if (typeof e.code === "number") return { code: e.code, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
    const why = timedOut ? "killed after 30 s" : e.signal ? `killed by ${e.signal}` : String(e.code ?? error);
    return { code: CLI_NO_EXIT, stdout: e.stdout ?? "", stderr: `${e.stderr ?? ""}[cli: no exit of its own: ${why}]\n` };
  } finally {
    clearTimeout(bound);
  }
}
