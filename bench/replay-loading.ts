import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { pino } from "pino";
import {
  expandGlobs,
  newReadStats,
  readRecords,
  writeStepRecords,
  type MessageNode,
  type ReadStats,
  type RecordFilters,
  type TraceRecord,
} from "../participants/replay/index.js";
import { machine, writeSection } from "./bench-report.js";

/**
 * Index-selected vs full-parse loading of rollout records. One generated record set (default
 * 512 MiB, `REPLAY_BENCH_MB`), about 10% of records selected by `max_source_reward = 0.5`; both
 * paths read the same files in the same run. Targets: bytes parsed within 1% of the selected
 * bytes, index-selected at least 5× faster than the full parse.
 */
const TARGET_MB = Number(process.env["REPLAY_BENCH_MB"] ?? 512);
const ROUNDS = Number(process.env["REPLAY_BENCH_ROUNDS"] ?? 3);
const ENVS = ["gsm8k", "mbpp", "swe", "math"];
const RECORDS_PER_FILE = 64;
const FILTERS: RecordFilters = { minReward: null, maxReward: 0.5, minBranches: 1 };
const logger = pino({ level: "silent" });

/** A tool-using rollout of ~20 turns with token ids, masks and logprobs, ~64 KiB as JSON. */
function templateNodes(): MessageNode[] {
  const nodes: MessageNode[] = [];
  const add = (message: MessageNode["message"], sampled: boolean, tokens: number) => {
    nodes.push({
      parent: nodes.length === 0 ? null : nodes.length - 1,
      message,
      sampled,
      token_ids: Array.from({ length: tokens }, (_, i) => (i * 7919) % 151_000),
      mask: Array.from({ length: tokens }, () => sampled),
      logprobs: sampled ? Array.from({ length: tokens }, (_, i) => -((i % 97) / 53)) : [],
    });
  };
  add({ role: "system", content: "You are a careful solver. Use python when it helps." }, false, 24);
  add({ role: "user", content: "Combien font 6×7 ? Réponds avec le résultat — 答えは？ 🙂" }, false, 32);
  for (let turn = 0; turn < 9; turn++) {
    const id = `call_${turn}`;
    add({ role: "assistant", content: null, tool_calls: [{ id, name: "python", arguments: JSON.stringify({ code: `print(6*7+${turn})` }) }] }, true, 180);
    add({ role: "tool", tool_call_id: id, content: `${42 + turn}\n`.repeat(12) }, false, 60);
  }
  add({ role: "assistant", content: "The answer is 42." }, true, 120);
  return nodes;
}

function makeTrace(nodes: MessageNode[], n: number): TraceRecord {
  return {
    id: n.toString(16).padStart(32, "0"),
    task: { idx: n, name: "bench", prompt: "Combien font 6×7 ?", answer: "42" },
    nodes,
    rewards: { correct: n % 10 === 3 ? 0 : 1 }, // every tenth record is "incorrect": a 10% selection
    metrics: { turns: 10 },
    info: {},
    is_completed: true,
    stop_condition: null,
    errors: [],
  };
}

async function generate(root: string, targetBytes: number): Promise<{ files: number; records: number; bytes: number }> {
  const nodes = templateNodes();
  let bytes = 0;
  let records = 0;
  let files = 0;
  for (let step = 1; bytes < targetBytes; step++) {
    const batches = ENVS.map((env) => ({
      kind: "train" as const,
      env,
      traces: Array.from({ length: RECORDS_PER_FILE }, () => makeTrace(nodes, records++)),
      policyVersion: step - 1,
    }));
    const written = await writeStepRecords(root, step, batches);
    for (const w of written) bytes += w.bytes;
    files += written.length;
  }
  return { files, records, bytes };
}

async function load(files: string[], useIndex: boolean): Promise<{ ms: number; stats: ReadStats; selected: number; selectedBytes: number }> {
  const stats = newReadStats();
  let selected = 0;
  let selectedBytes = 0;
  const started = performance.now();
  for (const file of files) {
    for await (const record of readRecords(file, { filters: FILTERS, stats, useIndex, logger })) {
      selected += 1;
      selectedBytes += record.len;
    }
  }
  return { ms: performance.now() - started, stats, selected, selectedBytes };
}

const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;

export async function run(): Promise<void> {
  const dir = await mkdtemp(path.join(tmpdir(), "gym-ckpt-bench-replay-"));
  try {
    const genStart = performance.now();
    const set = await generate(dir, TARGET_MB * 2 ** 20);
    const genMs = performance.now() - genStart;
    const files = await expandGlobs([path.join(dir, "step_*", "train_rollouts_*.jsonl")], dir);
    // Warm page cache (the files were just written) and JIT (one file each way), then alternate
    // the two paths for a few rounds and keep each one's median round.
    await load(files.slice(0, 1), true);
    await load(files.slice(0, 1), false);
    const rounds: Array<{ indexed: Awaited<ReturnType<typeof load>>; full: Awaited<ReturnType<typeof load>> }> = [];
    for (let i = 0; i < ROUNDS; i++) rounds.push({ indexed: await load(files, true), full: await load(files, false) });
    const median = <T extends { ms: number }>(xs: T[]) => [...xs].sort((a, b) => a.ms - b.ms)[Math.floor(xs.length / 2)]!;
    const indexed = median(rounds.map((r) => r.indexed));
    const full = median(rounds.map((r) => r.full));

    if (indexed.selected !== full.selected || indexed.selectedBytes !== full.selectedBytes) {
      throw new Error(`paths disagree: ${indexed.selected} vs ${full.selected} records`);
    }
    const parsedVsSelected = (indexed.stats.bytesParsed - indexed.selectedBytes) / indexed.selectedBytes;
    const speedup = full.ms / indexed.ms;
    const ok = Math.abs(parsedVsSelected) <= 0.01 && speedup >= 5;
    const row = (name: string, r: typeof indexed) =>
      `| ${name} | ${r.selected} | ${mib(r.stats.bytesParsed)} | ${mib(r.stats.bytesRead)} | ${r.stats.spansRead} | ${(r.ms / 1000).toFixed(2)} s |`;

    const markdown = [
      "## Replay: index-selected vs full-parse loading",
      "",
      `Machine: ${machine()}. Command: \`npm run bench -- replay-loading\` (size via \`REPLAY_BENCH_MB\`, default 512).`,
      `Record set: ${set.records} records in ${set.files} files (${mib(set.bytes)}, generated with the record writer in ${(genMs / 1000).toFixed(1)} s);` +
        ` selection \`max_source_reward = 0.5\` keeps ${indexed.selected} records (${((100 * indexed.selectedBytes) / set.bytes).toFixed(1)}% of bytes, ${mib(indexed.selectedBytes)}).` +
        ` Both paths read the same files in one run (warm page cache, ${ROUNDS} alternating rounds, median wall time) and parse and zod-validate what they select.`,
      "",
      "| path | records | bytes parsed | record bytes read | span reads | wall time |",
      "| --- | --- | --- | --- | --- | --- |",
      row("index-selected", indexed),
      row("full parse", full),
      "",
      `Index files read: ${mib(indexed.stats.indexBytesRead)}.` +
        ` Bytes parsed vs selected bytes: ${(100 * parsedVsSelected).toFixed(2)}% (target within 1%).` +
        ` Speed-up: ${speedup.toFixed(1)}× (target ≥ 5×). ${ok ? "Both targets met." : "TARGET MISSED."}`,
    ].join("\n");
    console.log(markdown);
    await writeSection("replay-loading", markdown);
    if (!ok) process.exitCode = 1;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  run().catch((error: unknown) => {
    console.error(error);
    process.exit(1);
  });
}
