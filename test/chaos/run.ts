import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { backendAdmin } from "../support/policy-backend-admin.js";
import { runSchedule } from "./faults.js";
import { checkpointsVerify, collectorExit, noProcessLeft, noRepeatedCalls, rowsOnce, type Broken } from "./invariants.js";
import { ProcessLogs } from "./process-logs.js";
import { ProgressWatch } from "./progress.js";
import { describeFault, faultSchedule, losesWork } from "./schedule.js";
import { startChaosWorld } from "./world.js";

/**
 * `npm run chaos -- --seeds 1-5`: one seeded world at a time (never two: the timing is the test),
 * each under a fault schedule drawn from its seed, then the invariants. A failing seed's directory
 * (every process's log, the schedule, results, dispatch log, checkpoints) is kept and printed.
 *
 * Flags: --seeds 1-5,9  --rows 200  --window-s 30 (faults fall in [1 s, window])  --timeout-s 240
 *        --keep (keep passing seeds' directories too)
 */
function parseArgs(argv: string[]) {
  const flags: Record<string, string> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith("--")) throw new Error(`unexpected argument ${a}`);
    if (a === "--keep") flags.keep = "1";
    else flags[a.slice(2)] = argv[++i] ?? "";
  }
  const seeds: number[] = [];
  for (const part of (flags.seeds ?? "1").split(",")) {
    const [lo, hi] = part.split("-").map(Number);
    for (let s = lo!; s <= (hi ?? lo)!; s++) seeds.push(s);
  }
  if (seeds.some((s) => !Number.isInteger(s))) throw new Error(`bad --seeds ${flags.seeds}`);
  return { seeds, rows: Number(flags.rows ?? 200), windowMs: Number(flags["window-s"] ?? 30) * 1000, timeoutMs: Number(flags["timeout-s"] ?? 240) * 1000, keep: flags.keep === "1" };
}

/** The world being torn down on Ctrl-C: whatever runs now is killed before the harness exits. */
let closeCurrent: (() => Promise<void>) | undefined;

async function runSeed(seed: number, o: ReturnType<typeof parseArgs>): Promise<{ ok: boolean; line: string; dir: string }> {
  const dir = await mkdtemp(join(tmpdir(), `gym-ckpt-chaos-seed${seed}-`));
  const logsDir = join(dir, "logs");
  await mkdir(logsDir);
  const logs = new ProcessLogs(logsDir);
  const faults = faultSchedule(seed, o.windowMs);
  await writeFile(join(dir, "schedule.json"), `${JSON.stringify({ seed, rows: o.rows, faults }, null, 1)}\n`);
  logs.note(`seed ${seed} schedule: ${faults.map(describeFault).join(" ")}`);
  const broken: Broken[] = [];
  let summary = "";
  let world: Awaited<ReturnType<typeof startChaosWorld>> | undefined;
  try {
    world = await startChaosWorld(seed, join(dir, "root"), o.rows, logs, (close) => (closeCurrent = close));
    const t0 = Date.now();
    await world.collector.start();
    const progress = new ProgressWatch(join(world.root, "results.jsonl"), t0);
    progress.start();
    const schedule = runSchedule(world, faults, t0, logs);
    let timer: NodeJS.Timeout | undefined;
    const exit = await Promise.race([world.collector.finished, new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), o.timeoutMs)))]);
    clearTimeout(timer);
    const endMs = Date.now() - t0;
    logs.note(`collection ended after ${endMs} ms: ${JSON.stringify(exit)}`);
    schedule.cancel();
    // A fault under way (a pause, a restart) finishes first, bounded: its restart would otherwise race the tear-down.
    await Promise.race([schedule.settled, new Promise((resolve) => setTimeout(resolve, 30_000))]);
    await progress.stop();
    const e = collectorExit(exit);
    if (e) broken.push(e);
    // The launcher restarts a server on its old port unless that stays taken; an environment that
    // moved leaves the collector's --run-url dead: the harness's doing, not the product's.
    if (world.gym.urls.environment !== world.runUrlBase) broken.push({ invariant: "harness", detail: `the environment moved from ${world.runUrlBase} to ${world.gym.urls.environment}: --run-url is stale` });
    // The backend's call log, read before the tear-down stops it.
    const calls = await backendAdmin(world.gym.urls.policy!.replace(/\/+$/, ""), "/admin/calls").then((b: any) => (Array.isArray(b) ? b : b.calls)).catch(() => undefined);
    if (calls) await writeFile(join(dir, "backend-calls.json"), `${JSON.stringify(calls, null, 1)}\n`);
    const gap = progress.longestGap(endMs, schedule.records);
    await world.close();
    closeCurrent = undefined;
    // Invariants over what the run left, everything stopped.
    broken.push(...(await rowsOnce(join(world.root, "results.jsonl"), world.rows)));
    const verified = await checkpointsVerify(world.root).catch((error) => ({ broken: [{ invariant: "checkpoints-verify", detail: `ls failed: ${String(error)}` }], verified: 0 }));
    broken.push(...verified.broken);
    // Only the faults that ran count: one skipped (the collection was over) lost nothing.
    const enforced = !schedule.records.some((r) => losesWork(r.fault));
    const repeats = calls ? noRepeatedCalls(calls, enforced) : { repeated: -1, broken: { invariant: "no-delivered-call-repeated", detail: "backend call log unreadable" } };
    if (repeats.broken) broken.push(repeats.broken);
    const left = await noProcessLeft(world.pids, [world.root, world.deployment]);
    if (left) broken.push(left);
    const rows = readFile(join(world.root, "results.jsonl"), "utf8").then((t) => t.split("\n").filter(Boolean).length).catch(() => 0);
    summary =
      `faults=[${schedule.records.map((r) => `${r.label}${r.outcome?.startsWith("error") ? "!" : ""}`).join(" ")}] rows=${await rows}/${o.rows} ` +
      `collectors=${world.collector.restarts + 1} checkpoints=${verified.verified} repeated_calls=${repeats.repeated}${enforced ? "" : "(not enforced)"} ` +
      `end=${(endMs / 1000).toFixed(1)}s gaps=max ${((gap.toMs - gap.fromMs) / 1000).toFixed(1)}s@${(gap.fromMs / 1000).toFixed(1)}s[${gap.faults.join(" ")}]`;
  } catch (error) {
    broken.push({ invariant: "harness", detail: error instanceof Error ? (error.stack ?? error.message) : String(error) });
  } finally {
    await closeCurrent?.().catch(() => undefined);
    closeCurrent = undefined;
    for (const b of broken) logs.note(`BROKEN ${b.invariant}: ${b.detail}`);
    await logs.close();
  }
  const ok = broken.length === 0;
  const line = ok ? `seed ${seed}: pass ${summary}` : `seed ${seed}: FAIL ${broken.map((b) => `${b.invariant} (${b.detail.split("\n")[0]})`).join("; ")} ${summary} logs=${dir}`;
  if (ok && !o.keep) await rm(dir, { recursive: true, force: true });
  return { ok, line, dir };
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  let interrupted = false;
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.on(signal, () => {
      if (interrupted) process.exit(130);
      interrupted = true;
      process.stderr.write(`\n${signal}: killing the current seed's processes\n`);
      void (closeCurrent?.() ?? Promise.resolve()).finally(() => process.exit(130));
    });
  }
  let passed = 0;
  let failed = 0;
  for (const seed of o.seeds) {
    const result = await runSeed(seed, o);
    if (interrupted) break;
    if (result.ok) passed++;
    else failed++;
    console.log(result.line);
  }
  console.log(`${passed} passed, ${failed} failed`);
  // Every process is gone by now (checked per seed); a library's idle handle must not keep the harness up.
  process.exit(failed ? 1 : 0);
}

process.on("unhandledRejection", (error) => process.stderr.write(`chaos: unhandled rejection: ${String(error)}\n`));
await main();
