import { execFileSync, spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { getHeapStatistics } from "node:v8";
import { pino } from "pino";
import { Collector, type CollectorController } from "../coordinator/collect/collector.js";
import { readTaskRows } from "../coordinator/collect/task-rows.js";
import { machine, writeSection } from "./bench-report.js";

/**
 * What `gym-ckpt collect` holds per task once it has read `--tasks` and started (every row's state
 * built, nothing sent yet), for tasks files of 10^5–10^6 rows. Each case runs in a fresh Node
 * process with Node's default heap limit, side by side: the tasks file read as a regular file (each
 * row keeps where its line is; the line is read again when the row is sent) and the same bytes read
 * through a FIFO (which cannot be read again: every task is kept parsed, as every tasks file was
 * before). Sizes via `COLLECT_BENCH_ROWS` and `COLLECT_BENCH_BYTES` (comma-separated).
 */
const ROWS = (process.env["COLLECT_BENCH_ROWS"] ?? "100000,500000").split(",").map(Number);
const BYTES = (process.env["COLLECT_BENCH_BYTES"] ?? "1024,8192").split(",").map(Number);

interface Measured {
  rows: number;
  readSeconds: number;
  /** Before the read (the modules loaded), then after it, then after the collector's start-up, each after a full GC. */
  heapBase: number;
  heapRead: number;
  heapStarted: number;
  rssStarted: number;
  maxRss: number;
}

const MiB = 2 ** 20;

/** A tasks file of `rows` lines of about `bytes` bytes each. */
async function writeTasks(path: string, rows: number, bytes: number): Promise<void> {
  const out = createWriteStream(path);
  const words = "solve the problem step by step and give the final answer as a number; ".repeat(Math.ceil(bytes / 60) + 2);
  for (let i = 0; i < rows; i++) {
    const line = JSON.stringify({ id: `t-${i}`, task: { prompt: words.slice(i % 60, (i % 60) + bytes - 110), answer: String(i * 7), meta: { level: i % 5, tags: ["math", "bench"] } } });
    if (!out.write(`${line}\n`)) await new Promise<void>((resolve) => out.once("drain", () => resolve()));
  }
  await new Promise<void>((resolve, reject) => out.end((error?: Error | null) => (error ? reject(error) : resolve())));
}

/** One case in a fresh process: its measures, or why it ended without them (an OOM, say). */
function measureIn(child: { tasks: string; via: "file" | "fifo"; dir: string }): Promise<Measured | string> {
  return new Promise((resolve) => {
    const proc = spawn(process.execPath, ["--expose-gc", fileURLToPath(import.meta.url)], {
      env: { ...process.env, COLLECT_BENCH_CHILD: JSON.stringify(child) },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    let err = "";
    proc.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    proc.stderr.on("data", (chunk: Buffer) => (err = (err + chunk.toString()).slice(-4000)));
    proc.on("exit", (code, signal) => {
      if (code === 0) return resolve(JSON.parse(out) as Measured);
      const oom = /heap out of memory|Allocation failed/.test(err);
      resolve(oom ? `out of memory (heap limit ${(getHeapStatistics().heap_size_limit / MiB).toFixed(0)} MiB)` : `exit ${code ?? signal}: ${err.trim().split("\n").at(-1)}`);
    });
  });
}

async function childMain(): Promise<void> {
  const { tasks, via, dir } = JSON.parse(process.env["COLLECT_BENCH_CHILD"]!) as { tasks: string; via: "file" | "fifo"; dir: string };
  const gc = () => {
    (globalThis as { gc?: () => void }).gc?.();
    (globalThis as { gc?: () => void }).gc?.();
  };
  let path = tasks;
  if (via === "fifo") {
    path = join(dir, "tasks.fifo");
    execFileSync("mkfifo", [path]);
    // Its open waits for this reader; it exits once the file is written through.
    spawn("sh", ["-c", 'cat "$1" > "$2"', "sh", tasks, path], { stdio: "ignore" });
  }
  gc();
  const heapBase = process.memoryUsage().heapUsed;
  const t0 = performance.now();
  const rows = await readTaskRows(path);
  const readSeconds = (performance.now() - t0) / 1000;
  gc();
  const heapRead = process.memoryUsage().heapUsed;
  const ops: Record<string, (req: never) => Promise<unknown>> = {
    list: async () => ({ latest: null, checkpoints: [] }),
    status: async () => ({ checkpoint: null, participants: [] }),
    retire: async () => ({ participants: [] }),
    forget: async (req: { rollout_ids: string[] }) => ({ forgotten: req.rollout_ids }),
  };
  const controller = new Proxy({} as CollectorController, { get: (_t, op) => ops[String(op)] });
  const collector = new Collector({ rows, runUrl: "http://127.0.0.1:9/run", outPath: join(dir, "results.jsonl"), checkpointDir: join(dir, "root"), controller, logger: pino({ level: "silent" }), tasksPath: path });
  await collector.start();
  gc();
  const usage = process.memoryUsage();
  const measured: Measured = { rows: rows.length, readSeconds, heapBase, heapRead, heapStarted: usage.heapUsed, rssStarted: usage.rss, maxRss: process.resourceUsage().maxRSS * 1024 };
  process.stdout.write(JSON.stringify(measured));
  process.exit(0); // the collector holds its root's lock and timers: this process ends here
}

const mib = (bytes: number) => `${(bytes / MiB).toFixed(0)} MiB`;

export async function run(): Promise<void> {
  const root = await mkdtemp(join(tmpdir(), "gym-ckpt-bench-tasks-"));
  const lines: string[] = [];
  try {
    for (const bytes of BYTES) {
      for (const rows of ROWS) {
        const tasks = join(root, `tasks-${rows}-${bytes}.jsonl`);
        await writeTasks(tasks, rows, bytes);
        const size = (await stat(tasks)).size;
        const cells: string[] = [];
        for (const via of ["fifo", "file"] as const) {
          const dir = await mkdtemp(join(root, `${via}-`));
          execFileSync("mkdir", ["-p", join(dir, "root")]);
          const m = await measureIn({ tasks, via, dir });
          await rm(dir, { recursive: true, force: true });
          cells.push(
            typeof m === "string"
              ? `${m} | — | —`
              : `${mib(m.heapStarted)} (${Math.round((m.heapStarted - m.heapBase) / m.rows)} B/row; the rows alone ${Math.round((m.heapRead - m.heapBase) / m.rows)} B/row) | ${mib(m.rssStarted)} / ${mib(m.maxRss)} | ${m.readSeconds.toFixed(1)} s`,
          );
          console.log(`${rows} × ${bytes} B via ${via}: ${typeof m === "string" ? m : JSON.stringify(m)}`);
        }
        await rm(tasks, { force: true });
        lines.push(`| ${rows.toLocaleString("en")} × ${bytes} B (${mib(size)}) | held parsed (FIFO; every file before) | ${cells[0]} |`);
        lines.push(`| | read again when sent (regular file) | ${cells[1]} |`);
      }
    }
  } finally {
    await rm(root, { recursive: true, force: true });
  }
  await writeSection(
    "collect-task-memory",
    `## Collect: memory per task at start-up

Machine: ${machine()}. Command: \`npm run bench -- collect-task-memory\` (sizes via \`COLLECT_BENCH_ROWS\`, \`COLLECT_BENCH_BYTES\`).
Each case is a fresh Node process with Node's default heap limit (${mib(getHeapStatistics().heap_size_limit)} here): \`readTaskRows\` on the tasks file, then a \`Collector\` built and started on its rows (every row's state made, nothing sent), heap measured after a full GC (per row: less the heap before the read). Side by side, the same bytes: through a FIFO, which cannot be read again, so every task stays parsed (what every tasks file cost before rows held their line's place), and as a regular file, whose rows keep where their line is and its sha256 (the line is read again, and checked, when the row is sent).

| tasks | rows hold | heap after start-up | RSS after start-up / peak | read and validate |
| --- | --- | --- | --- | --- |
${lines.join("\n")}

The held tasks cost about their size in bytes of heap, so 500,000 tasks of 8 KB need the whole default heap before a row is sent. Read again when sent, the heap grows by about 400 bytes per row (the row's state, its id, the line's place and digest; half of it the collector's row state, which both pay) whatever the tasks' size. Either way every line is parsed and checked once at start-up (the regular file also hashes it); the read times are those of a shared machine, noisy between cases.`,
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  if (process.env["COLLECT_BENCH_CHILD"]) await childMain();
  else await run();
}
