import { execFileSync } from "node:child_process";
import { cpus, totalmem } from "node:os";
import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root: the nearest ancestor with package.json (works from bench/ and dist/bench/). */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json")) && dirname(dir) !== dir) dir = dirname(dir);
  return dir;
}

/** Shared by the benchmarks: machine description, percentiles, and their section of docs/benchmarks.md. */
export const BENCHMARKS_DOC = join(repoRoot(), "docs", "benchmarks.md");

export function machine(): string {
  const cpu = cpus()[0]?.model ?? "unknown CPU";
  return `${cpu}, ${cpus().length} cores, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}, ${process.platform}`;
}

/** Clock ticks per second of /proc's CPU times (USER_HZ), 100 where getconf cannot tell. */
export const CLOCK_TICKS = (() => {
  try {
    return Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
  } catch {
    return 100;
  }
})();

export function percentile(values: number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

/** Replaces (or appends) the section between `<!-- bench:name -->` and `<!-- /bench:name -->`. */
export async function writeSection(name: string, markdown: string): Promise<void> {
  let doc = "# Benchmarks\n\nMeasured on the project's shared 2-core machines; ratios are measured side by side in one run.\nRun all with `npm run bench`, one with `npm run bench -- <name>`.\n";
  try {
    doc = await readFile(BENCHMARKS_DOC, "utf8");
  } catch {
    // first benchmark writes the file
  }
  const open = `<!-- bench:${name} -->`;
  const close = `<!-- /bench:${name} -->`;
  const section = `${open}\n${markdown.trim()}\n${close}`;
  const start = doc.indexOf(open);
  const end = doc.indexOf(close);
  doc = start !== -1 && end > start ? doc.slice(0, start) + section + doc.slice(end + close.length) : `${doc.trimEnd()}\n\n${section}\n`;
  await writeFile(BENCHMARKS_DOC, doc);
}
