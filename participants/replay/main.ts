import path from "node:path";
import { parseArgs } from "node:util";
import { toCheckpointError } from "../../protocol/index.js";
import { exportCheckpointSeeds } from "./checkpoint-seeds.js";
import { ReplayError } from "./errors.js";
import { assertWritableOut, writeJsonLines } from "./out-file.js";
import { readTaskFile } from "./task-file.js";

/**
 * Replay tools.
 *   seeds --checkpoint <dir> --out <tasks.jsonl> [--tasks <file>]
 *     Exports a published checkpoint's parked episodes as `continue` seeds, one JSON line each.
 *     --tasks: a task file (collect's `{id, task}` lines or bare tasks; for replayed episodes, the
 *     `/replay/next` replies or `/run` bodies they ran) to attach original tasks.
 * Prints a one-line JSON summary on stdout; --help prints the usage. Exit codes, like gym-ckpt's:
 * 2 on usage errors and `invalid_request` (a missing or malformed --tasks file, a directory that is
 * not a published checkpoint, an --out whose directory does not exist or that is not a regular
 * file), 1 on any other refusal (`<code>: <detail>` on stderr).
 */
const USAGE = "usage: gym-ckpt seeds --checkpoint <dir> --out <tasks.jsonl> [--tasks <file>]\n";

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  // Help asked for before any command (`main.js --help`), as after one.
  if (command === "--help" || command === "-h") {
    process.stdout.write(USAGE);
    return 0;
  }
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
  const out = path.resolve(values.out);
  await assertWritableOut(out, { checkpoint: path.resolve(values.checkpoint), ...(values.tasks !== undefined && { tasks: values.tasks }) });
  const tasks = values.tasks ? await readTaskFile(values.tasks) : undefined;
  const exported = await exportCheckpointSeeds(path.resolve(values.checkpoint), tasks ? { tasks } : {});
  // Checked above, and never created here: a directory removed meanwhile fails the write.
  await writeJsonLines(out, exported.seeds);
  process.stdout.write(`${JSON.stringify({ checkpoint_id: exported.checkpointId, seeds: exported.seeds.length, skipped: exported.skipped, out })}\n`);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error: unknown) => {
    // Refusals carry a catalog code; a file call the storage refused is storage_error, anything else a bug.
    const { code, message } = error instanceof ReplayError ? error : toCheckpointError(error);
    process.stderr.write(`replay: ${code}: ${message}\n`);
    process.exit(code === "invalid_request" ? 2 : 1);
  },
);
