import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

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

/** Runs a participant program in the foreground with inherited stdio, forwarding SIGINT/SIGTERM. */
export function runParticipantProgram(relativePath: string, args: string[]): Promise<number> {
  const child = spawn(process.execPath, [participantEntry(relativePath), ...args], { stdio: "inherit" });
  const forward = (signal: NodeJS.Signals) => child.kill(signal);
  process.on("SIGINT", forward);
  process.on("SIGTERM", forward);
  return new Promise((resolve) => {
    child.once("exit", (code, signal) => {
      process.off("SIGINT", forward);
      process.off("SIGTERM", forward);
      resolve(code ?? (signal ? 128 + 15 : 1));
    });
  });
}
