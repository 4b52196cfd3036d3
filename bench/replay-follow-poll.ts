import { mkdir, mkdtemp, readdir, realpath, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expandGlobFiles } from "../participants/replay/record-glob.js";
import { machine, percentile, writeSection } from "./bench-report.js";

/**
 * What one follow-mode poll of the replay source costs as a run's step directories accumulate: the
 * glob expansion a reload does before it finds nothing new (with `wait_for_step_marker`, two).
 * Patterns: `step_*\/train_rollouts_gsm8k.jsonl` (the file named literally, as docs/replay.md's
 * example) and `step_*\/*` (listed). Side by side for the literal one, in the same run on the same
 * tree: what its expansion did per step before (a stat and a realpath of each step's file), and
 * what it does now (one lstat). Sizes via `REPLAY_POLL_BENCH_STEPS` (comma-separated).
 */
const STEPS = (process.env["REPLAY_POLL_BENCH_STEPS"] ?? "2000,10000,50000").split(",").map(Number);
const ROUNDS = 5;
const FILE = "train_rollouts_gsm8k.jsonl";

/** The literal pattern's expansion as it was: list step_*, then stat and resolve each step's file. */
async function formerLiteralExpansion(root: string): Promise<number> {
  await realpath(root); // the directory the pattern starts from, resolved once per expansion (as now)
  let found = 0;
  for (const entry of await readdir(root, { withFileTypes: true })) {
    if (!entry.isDirectory() || !/^step_[^/]*$/.test(entry.name)) continue;
    const target = join(root, entry.name, FILE);
    const s = await stat(target).catch(() => undefined);
    if (s && !s.isDirectory()) {
      await realpath(target);
      found++;
    }
  }
  return found;
}

async function timed(fn: () => Promise<number>): Promise<{ wall: number; cpu: number; files: number }> {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const files = await fn();
  const cpu = process.cpuUsage(cpu0);
  return { wall: performance.now() - t0, cpu: (cpu.user + cpu.system) / 1000, files };
}

export async function run(): Promise<void> {
  const rows: string[] = [];
  for (const steps of STEPS) {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-bench-follow-"));
    try {
      const root = join(dir, "rollouts");
      for (let s = 0; s < steps; s++) {
        await mkdir(join(root, `step_${s}`), { recursive: true });
        await writeFile(join(root, `step_${s}`, FILE), "");
        await writeFile(join(root, `step_${s}`, "train_rollouts_math.jsonl"), "");
      }
      const cases: [string, () => Promise<number>][] = [
        ["`step_*/train_rollouts_gsm8k.jsonl`, before (stat + realpath per step)", () => formerLiteralExpansion(root)],
        ["`step_*/train_rollouts_gsm8k.jsonl`, now (lstat per step)", async () => (await expandGlobFiles([`step_*/${FILE}`], root)).length],
        ["`step_*/*` (a listing per step)", async () => (await expandGlobFiles(["step_*/*"], root)).length],
      ];
      const results = cases.map(() => [] as { wall: number; cpu: number; files: number }[]);
      for (let round = 0; round < ROUNDS; round++) for (const [i, [, fn]] of cases.entries()) results[i]!.push(await timed(fn));
      for (const [i, [name]] of cases.entries()) {
        const r = results[i]!;
        const wall = percentile(r.map((x) => x.wall), 50);
        const cpu = percentile(r.map((x) => x.cpu), 50);
        rows.push(`| ${steps.toLocaleString("en")} | ${name} | ${r[0]!.files.toLocaleString("en")} | ${wall.toFixed(0)} ms | ${cpu.toFixed(0)} ms | ${((cpu * 1000) / steps).toFixed(1)} µs |`);
        console.log(rows.at(-1));
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }
  await writeSection(
    "replay-follow-poll",
    `## Replay: what one follow poll costs as step directories accumulate

Machine: ${machine()}. Command: \`npm run bench -- replay-follow-poll\` (sizes via \`REPLAY_POLL_BENCH_STEPS\`).
A follower's reload expands its globs before it finds nothing new (twice with \`wait_for_step_marker\`); this times one expansion over a run's \`rollouts/\` with N step directories of two files each (warm cache, ${ROUNDS} rounds interleaved, medians; CPU is this process's user + system time). For the literal pattern, the row "before" repeats in this run what its expansion did per step until now (a stat and a realpath of each step's file).

| step dirs | pattern | files found | wall | CPU | CPU per step dir |
| --- | --- | --- | --- | --- | --- |
${rows.join("\n")}

A poll still grows with the step directories a run has (docs/replay.md, *Follow mode*: listings are not skipped while a directory's modification time stands still, which could miss an entry added within one clock tick); a literally named file now costs one \`lstat\` per step directory and poll instead of a \`stat\` and a \`realpath\`.`,
  );
}
