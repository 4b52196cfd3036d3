import { spawnSync } from "node:child_process";
import { readFileSync, rmSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { machine, percentile, repoRoot, writeSection } from "./bench-report.js";

/**
 * Process start-up: the entries the build ships, bundled (deploy/bundle-entries.mjs), against
 * tsc's output of the same sources, side by side: each round runs every program once from each,
 * alternating. Measured: wall time of the whole process, and the CPU it spent (user + system, as
 * the process reports it on exit through a preloaded hook, the same for both).
 */
const ROOT = repoRoot();
/** Inside the repository, so that tsc's output finds node_modules; .tmp/ is gitignored. */
const UNBUNDLED = join(ROOT, ".tmp", "startup-bench-unbundled");

interface Sample {
  wallMs: number;
  cpuMs: number;
}

function runOnce(entry: string, args: string[], preload: string, report: string): Sample {
  rmSync(report, { force: true }); // never the previous run's
  const started = process.hrtime.bigint();
  const result = spawnSync(process.execPath, ["--require", preload, entry, ...args], { env: { ...process.env, STARTUP_BENCH_REPORT: report }, stdio: ["ignore", "ignore", "pipe"] });
  const wallMs = Number(process.hrtime.bigint() - started) / 1e6;
  if (result.status !== 0) throw new Error(`${entry} ${args.join(" ")} exited ${result.status ?? result.signal}: ${result.stderr.toString().slice(0, 500)}`);
  const { cpuMs } = JSON.parse(readFileSync(report, "utf8")) as { cpuMs: number };
  return { wallMs, cpuMs };
}

export async function run(): Promise<void> {
  const rounds = Number(process.env.STARTUP_BENCH_ROUNDS ?? 15);
  const work = await mkdtemp(join(tmpdir(), "gym-ckpt-startup-bench-"));
  const preload = join(work, "cpu-report.cjs");
  const report = join(work, "report.json");
  await writeFile(
    preload,
    `process.on("exit", () => { const u = process.cpuUsage(); require("node:fs").writeFileSync(process.env.STARTUP_BENCH_REPORT, JSON.stringify({ cpuMs: (u.user + u.system) / 1000 })); });\n`,
  );
  const programs = [
    { name: "`gym-ckpt --help` (the CLI)", entry: "coordinator/cli/main.js", args: ["--help"] },
    { name: "`gym-ckpt ls --json` of an empty root", entry: "coordinator/cli/main.js", args: ["ls", "--root", work, "--json"] },
    { name: "environment server `--help`", entry: "participants/gym/environment-server/main.js", args: ["--help"] },
    { name: "attach proxy `--help`", entry: "participants/attach/main.js", args: ["--help"] },
  ];
  try {
    console.log("compiling the unbundled copy (tsc) …");
    const tsc = createRequire(import.meta.url).resolve("typescript/bin/tsc");
    await rm(UNBUNDLED, { recursive: true, force: true });
    const compiled = spawnSync(process.execPath, [tsc, "-p", "tsconfig.build.json", "--outDir", UNBUNDLED], { cwd: ROOT, stdio: "inherit" });
    if (compiled.status !== 0) throw new Error(`tsc exited ${compiled.status}`);
    const samples = programs.map(() => ({ bundled: [] as Sample[], unbundled: [] as Sample[] }));
    for (let round = 0; round < rounds; round++) {
      programs.forEach((p, i) => {
        for (const variant of ["bundled", "unbundled"] as const) {
          const entry = join(variant === "bundled" ? join(ROOT, "dist") : UNBUNDLED, p.entry);
          const sample = runOnce(entry, p.args, preload, report);
          samples[i]![variant].push(sample);
        }
      });
      process.stdout.write(`\rround ${round + 1}/${rounds}`);
    }
    process.stdout.write("\n");
    const rows: string[] = [];
    programs.forEach((p, i) => {
      const s = samples[i]!;
      const med = (xs: Sample[], k: keyof Sample) => percentile(xs.map((x) => x[k]), 50);
      const row = `| ${p.name} | ${med(s.bundled, "wallMs").toFixed(0)} / ${med(s.unbundled, "wallMs").toFixed(0)} | ${med(s.bundled, "cpuMs").toFixed(0)} / ${med(s.unbundled, "cpuMs").toFixed(0)} | ${(med(s.bundled, "cpuMs") / med(s.unbundled, "cpuMs")).toFixed(2)} |`;
      console.log(row);
      rows.push(row);
    });
    await writeSection(
      "process-startup",
      `## Process start-up: bundled entries vs tsc's output

Machine: ${machine()}. Command: \`npm run bench -- process-startup\` (rounds via \`STARTUP_BENCH_ROUNDS\`, default 15). Each round runs every program once from the built \`dist/\` (entries bundled by \`deploy/bundle-entries.mjs\`; the CLI's \`program.js\`, its entry kept small) and once from tsc's output of the same sources, alternating; medians over ${rounds} rounds. CPU is user + system as the process reports it at exit (a preloaded hook, the same for both).

| program | wall ms, bundled / tsc | CPU ms, bundled / tsc | CPU ratio |
| --- | --- | --- | --- |
${rows.join("\n")}
`,
    );
  } finally {
    await rm(UNBUNDLED, { recursive: true, force: true });
    await rm(work, { recursive: true, force: true });
  }
}
