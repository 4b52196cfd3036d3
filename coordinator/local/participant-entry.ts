import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { constants } from "node:os";
import { fileURLToPath } from "node:url";
import { parentWatch } from "./child-program.js";

/**
 * Participant-side programs (reference Gym, attach proxies) run as their own processes: the CLI
 * starts them by path instead of importing them, so coordinator/ and participants/ stay apart.
 * Paths are relative to the package root and resolved beside this compiled file (dist/ or source).
 */
export function participantEntry(relativePath: string): string {
  const extension = import.meta.url.endsWith(".ts") ? ".ts" : ".js";
  const path = fileURLToPath(new URL(`../../participants/${relativePath}${extension}`, import.meta.url));
  if (!existsSync(path)) throw new Error(`${path} is missing; run \`npm run build\` first`);
  return path;
}

const IGNORE_SIGUSR1 = new URL(`./ignore-sigusr1${import.meta.url.endsWith(".ts") ? ".ts" : ".js"}`, import.meta.url).href;

/**
 * NODE_OPTIONS that preload ignore-sigusr1.ts into a participant program and every node process it
 * starts (the Gym's servers); the caller's own NODE_OPTIONS kept. Empty where `--import` is missing.
 */
export function ignoreSigusr1Env(): NodeJS.ProcessEnv {
  if (!process.allowedNodeEnvironmentFlags.has("--import")) return {};
  const own = process.env.NODE_OPTIONS?.trim();
  return { NODE_OPTIONS: `${own ? `${own} ` : ""}--import ${IGNORE_SIGUSR1}` };
}

/**
 * Runs a participant program in the foreground with inherited output, forwarding SIGINT, SIGTERM
 * and SIGHUP (its terminal closed: the program stops as on SIGTERM, then dies by SIGHUP, and so
 * does this process: an ordinary exit aborts in Node 20 once the terminal is gone, nodejs/node#51519).
 * It stops once this process is gone, however it ended (SIGKILL included): an orphaned attach
 * proxy would keep its instance's membership claim, and its restart would be `instance_conflict`.
 * `env` is added to this process's environment for it (a flag's value kept off its command line).
 */
export function runParticipantProgram(relativePath: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<number> {
  const watch = parentWatch();
  const child = spawn(process.execPath, [...(watch?.nodeArgs ?? []), participantEntry(relativePath), ...args], {
    stdio: [watch?.stdin ?? "inherit", "inherit", "inherit"],
    env: { ...process.env, ...env, ...ignoreSigusr1Env() },
  });
  child.stdin?.on("error", () => undefined); // never written; closed when the child exits
  const forward = (signal: NodeJS.Signals) => child.kill(signal);
  process.on("SIGINT", forward);
  process.on("SIGTERM", forward);
  process.on("SIGHUP", forward);
  return new Promise((resolve) => {
    child.once("exit", (code, signal) => {
      process.off("SIGINT", forward);
      process.off("SIGTERM", forward);
      process.off("SIGHUP", forward);
      if (signal === "SIGHUP" && process.listenerCount("SIGHUP") === 0) process.kill(process.pid, "SIGHUP");
      resolve(exitCodeOf(code, signal));
    });
  });
}

/** A child's exit as a process exit code: its own code, or for a signal the shell convention 128 + its number (SIGINT 130, SIGKILL 137, SIGTERM 143). */
export function exitCodeOf(code: number | null, signal: NodeJS.Signals | null): number {
  return code ?? (signal ? 128 + constants.signals[signal] : 1);
}
