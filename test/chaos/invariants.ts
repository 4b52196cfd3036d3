import { execFile } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { verifyCalls } from "../../coordinator/local/demo.js";
import { CLI } from "./coordinators.js";

/**
 * The promise under test, checked once everything stopped: each check returns the broken
 * invariant's name and detail, or nothing.
 */
export interface Broken {
  invariant: string;
  detail: string;
}

const execFileAsync = promisify(execFile);

export function collectorExit(exit: { code: number | null; signal: NodeJS.Signals | null } | "timeout"): Broken | undefined {
  if (exit === "timeout") return { invariant: "collector-exit-0", detail: "no exit within the overall timeout" };
  if (exit.code !== 0) return { invariant: "collector-exit-0", detail: `exited ${JSON.stringify(exit)}` };
  return undefined;
}

/** Every row exactly one line in results.jsonl, no line for a row the tasks do not name. */
export async function rowsOnce(out: string, rows: string[]): Promise<Broken[]> {
  const text = await readFile(out, "utf8").catch(() => "");
  const counts = new Map<string, number>();
  const unknown: string[] = [];
  const wanted = new Set(rows);
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    let id: unknown;
    try {
      id = (JSON.parse(line) as { rollout_id?: unknown }).rollout_id;
    } catch {
      unknown.push(`torn line ${JSON.stringify(line.slice(0, 80))}`);
      continue;
    }
    if (typeof id !== "string" || !wanted.has(id)) unknown.push(String(id));
    else counts.set(id, (counts.get(id) ?? 0) + 1);
  }
  const broken: Broken[] = [];
  const missing = rows.filter((r) => !counts.has(r));
  const twice = [...counts].filter(([, n]) => n > 1).map(([id, n]) => `${id}×${n}`);
  if (missing.length) broken.push({ invariant: "every-row-finished", detail: `${missing.length} rows without a result: ${missing.slice(0, 10).join(",")}` });
  if (twice.length) broken.push({ invariant: "no-row-twice", detail: twice.slice(0, 10).join(",") });
  if (unknown.length) broken.push({ invariant: "no-unknown-row", detail: unknown.slice(0, 5).join(",") });
  return broken;
}

/** `gym-ckpt verify` on every published checkpoint left under the root. */
export async function checkpointsVerify(root: string): Promise<{ broken: Broken[]; verified: number }> {
  const { stdout } = await execFileAsync(process.execPath, [CLI, "ls", "--root", root, "--json"], { timeout: 30_000 });
  const listed = JSON.parse(stdout) as { latest: string | null; latest_error?: { code: string; detail: string }; checkpoints: { checkpoint_id: string }[]; damaged?: { checkpoint_id: string; code: string; detail: string }[] };
  const ids = listed.checkpoints.map((c) => c.checkpoint_id);
  const broken: Broken[] = [];
  if (listed.latest_error) broken.push({ invariant: "checkpoints-verify", detail: `LATEST: ${listed.latest_error.code}: ${listed.latest_error.detail}` });
  for (const d of listed.damaged ?? []) broken.push({ invariant: "checkpoints-verify", detail: `${d.checkpoint_id} damaged: ${d.code}: ${d.detail}` });
  for (const id of ids) {
    try {
      await execFileAsync(process.execPath, [CLI, "verify", id, "--root", root], { timeout: 30_000 });
    } catch (error) {
      const e = error as { stdout?: string; stderr?: string };
      broken.push({ invariant: "checkpoints-verify", detail: `${id}: ${(e.stderr || e.stdout || String(error)).trim()}` });
    }
  }
  return { broken, verified: ids.length };
}

/**
 * No delivered model call made twice (the demo's verdict). Only a promise when no fault lost work:
 * a Gym or collector crash legitimately re-runs what was done since the last checkpoint.
 */
export function noRepeatedCalls(calls: Parameters<typeof verifyCalls>[0], enforced: boolean): { broken?: Broken; repeated: number } {
  const { repeated } = verifyCalls(calls);
  return { repeated, ...(enforced && repeated > 0 && { broken: { invariant: "no-delivered-call-repeated", detail: `${repeated} delivered calls repeated` } }) };
}

/** No spawned process alive, nor any process naming this world's root or deployment (grandchildren too). */
export async function noProcessLeft(pids: Set<number>, marks: string[]): Promise<Broken | undefined> {
  const left: string[] = [];
  for (const pid of pids) {
    try {
      process.kill(pid, 0);
      left.push(String(pid));
    } catch {
      // gone
    }
  }
  for (const entry of await readdir("/proc").catch(() => [] as string[])) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    const cmdline = await readFile(join("/proc", entry, "cmdline"), "utf8").catch(() => "");
    const stat = await readFile(join("/proc", entry, "stat"), "utf8").catch(() => "");
    if (/\) Z /.test(stat)) continue; // a zombie is dead, only not yet reaped
    if (marks.some((m) => cmdline.includes(m)) && !left.includes(entry)) left.push(`${entry}(${cmdline.replace(/\0/g, " ").slice(0, 80)})`);
  }
  return left.length ? { invariant: "no-process-left", detail: left.join(" ") } : undefined;
}
