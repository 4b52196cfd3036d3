import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { afterAll, beforeAll, expect } from "vitest";

/** One process racing for a lock: it runs `script` (ESM, TypeScript through tsx) and talks over IPC. */
export interface Racer {
  child: ChildProcess;
  /** The racer's next message (rejects if it exits first). */
  next(): Promise<Record<string, unknown>>;
}

function startRacer(script: string): Racer {
  const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const queue: Record<string, unknown>[] = [];
  const waiting: ((m: Record<string, unknown>) => void)[] = [];
  child.on("message", (m: Record<string, unknown>) => (waiting.length ? waiting.shift()!(m) : queue.push(m)));
  const exited = new Promise<never>((_, reject) => child.once("exit", (code, signal) => reject(new Error(`racer ${child.pid} exited (${code ?? signal})`))));
  exited.catch(() => undefined);
  return {
    child,
    next: () => Promise.race([queue.length ? Promise.resolve(queue.shift()!) : new Promise<Record<string, unknown>>((resolve) => waiting.push(resolve)), exited]),
  };
}

/**
 * `count` racers running `script`, started before the file's tests (each must first send
 * `{ready: true}`) and SIGKILLed after them. They stay up between rounds, so a round's race is as
 * tight as the machine's cores allow.
 */
export function racersFor(script: string, count: number): () => Racer[] {
  let racers: Racer[] = [];
  beforeAll(async () => {
    racers = Array.from({ length: count }, () => startRacer(script));
    expect(await Promise.all(racers.map((r) => r.next()))).toEqual(racers.map(() => ({ ready: true })));
  }, 60_000);
  afterAll(() => {
    for (const r of racers) r.child.kill("SIGKILL");
  });
  return () => racers;
}

/** Process `pid`'s start time (clock ticks since boot, /proc/<pid>/stat field 22), read independently of the code under test. */
export function startTimeOf(pid: number): string {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]!;
}

export const BOOT_ID = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
