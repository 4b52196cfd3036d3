import { readFile } from "node:fs/promises";
import path from "node:path";
import { parseArgs } from "node:util";
import { writeFileAtomic } from "../storage/fs-durable.js";
import { exportCheckpointSeeds } from "./checkpoint-seeds.js";

/**
 * Replay tools.
 *   seeds --checkpoint <dir> --out <tasks.jsonl> [--tasks <file>]
 *     Exports a published checkpoint's parked episodes as `continue` seeds, one JSON line each.
 *     --tasks: a task file (collect's `{id, task}` lines or bare tasks) to attach original tasks.
 * Prints a one-line JSON summary on stdout; exit 2 on usage errors, 1 on refusals; --help prints the usage.
 */
const USAGE = "usage: main.js seeds --checkpoint <dir> --out <tasks.jsonl> [--tasks <file>]\n";

async function readTasks(file: string): Promise<unknown[]> {
  const out: unknown[] = [];
  for (const [i, line] of (await readFile(file, "utf8")).split("\n").entries()) {
    if (!line.trim()) continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      throw new Error(`${file}:${i + 1}: not JSON`);
    }
    const row = value as { id?: unknown; task?: unknown };
    out.push(row && typeof row === "object" && "id" in row && "task" in row ? row.task : value);
  }
  return out;
}

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command !== "seeds") {
    process.stderr.write(USAGE);
    return 2;
  }
  let values: { checkpoint?: string; out?: string; tasks?: string; help?: boolean };
  try {
    ({ values } = parseArgs({ args: rest, options: { checkpoint: { type: "string" }, out: { type: "string" }, tasks: { type: "string" }, help: { type: "boolean" } }, strict: true }));
  } catch (error) {
    process.stderr.write(`${error instanceof Error ? error.message : String(error)}\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  if (!values.checkpoint || !values.out) {
    process.stderr.write(USAGE);
    return 2;
  }
  const tasks = values.tasks ? await readTasks(values.tasks) : undefined;
  const exported = await exportCheckpointSeeds(path.resolve(values.checkpoint), tasks ? { tasks } : {});
  await writeFileAtomic(path.resolve(values.out), exported.seeds.map((s) => `${JSON.stringify(s)}\n`).join(""));
  process.stdout.write(`${JSON.stringify({ checkpoint_id: exported.checkpointId, seeds: exported.seeds.length, skipped: exported.skipped, out: path.resolve(values.out) })}\n`);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error: unknown) => {
    const e = error as { code?: string; message?: string };
    process.stderr.write(`replay: ${e.code ? `${e.code}: ` : ""}${e.message ?? String(error)}\n`);
    process.exit(1);
  },
);
