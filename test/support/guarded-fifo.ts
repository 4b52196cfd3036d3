import { spawn, spawnSync } from "node:child_process";

/**
 * Makes a FIFO at `path` and runs the synchronous `read(path)` on it, timed. The guard: a blocking
 * read (a plain readFileSync) waits in open() for a writer, which a child process provides after
 * 2 s and closes at once, so the test ends either way; the read is synchronous, so no timer of this
 * process could end it.
 */
export function readGuardedFifo<T>(path: string, read: (path: string) => T): { outcome: T; ms: number } {
  if (spawnSync("mkfifo", [path]).status !== 0) throw new Error(`mkfifo ${path} failed`);
  const writer = spawn("timeout", ["5", "sh", "-c", 'sleep 2; : > "$0"', path], { stdio: "ignore" });
  try {
    const began = Date.now();
    const outcome = read(path);
    return { outcome, ms: Date.now() - began };
  } finally {
    writer.kill("SIGKILL");
  }
}
