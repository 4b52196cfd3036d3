import type { Command } from "commander";
import { CheckpointError, GLOBAL_MANIFEST_FILE, LATEST_FILE } from "../../../protocol/index.js";
import { CheckpointCatalog } from "../../publication/checkpoint-catalog.js";
import { verifyCheckpoint, type UnreferencedFile } from "../../publication/verify-checkpoint.js";
import { printJson, rootFrom, runCli } from "../shared.js";

/** What each kind of file no manifest names is, in the warning line. */
const UNREFERENCED_KINDS: Readonly<Record<UnreferencedFile["kind"], string>> = {
  temp: "a crashed writer's temp file",
  records: "a records file its participant's manifest does not name",
  other: "not a file gym-ckpt writes",
};

export function register(program: Command): void {
  program
    .command("verify <checkpoint>")
    .description("re-read every manifest and record of a checkpoint; exit 1 naming the error code on any mismatch, a warning for each file no manifest names")
    .option("--root <dir>", "checkpoint root (env GYM_CKPT_CHECKPOINT_ROOT)")
    .option("--json", "print the report as JSON")
    .option("--strict", "a file no manifest names is an error (invalid_checkpoint_state, exit 1), not a warning")
    .action(async (checkpoint: string, flags: { root?: string; json?: boolean; strict?: boolean }) => {
      await runCli(async () => {
        const catalog = new CheckpointCatalog(rootFrom(flags.root));
        const id = checkpoint === "LATEST" ? await catalog.latest() : checkpoint;
        if (id === null) throw new CheckpointError("not_found", `nothing is published under ${catalog.root}: it has no ${LATEST_FILE}`);
        const report = await verifyCheckpoint(catalog, id).catch((error: unknown) => {
          // LATEST is renamed only after checkpoint.json is durable: one naming an unpublished
          // checkpoint is a damaged root, which the refusal must say rather than name an id never asked for.
          if (checkpoint !== "LATEST" || !(error instanceof CheckpointError && error.code === "not_found")) throw error;
          throw new CheckpointError("not_found", `${LATEST_FILE} names checkpoint ${id}, which is not published under ${catalog.root} (no ${GLOBAL_MANIFEST_FILE})`, { cause: error });
        });
        // --strict: a check that wants the directory to hold exactly what was published (a copy's
        // audit, a clean-up's), where a leftover is worth failing on though a restore ignores it.
        const refused = flags.strict === true && report.unreferenced.length > 0;
        if (flags.json) printJson(report);
        else {
          if (!refused) process.stdout.write(`ok ${report.checkpoint_id}: ${report.participants.length} participants, ${report.records} records, ${report.bytes} bytes\n`);
          // Not refusals: a restore reads only what the manifests name (verifyCheckpoint says why).
          for (const { path, kind } of report.unreferenced) process.stderr.write(`warning: ${path} is named by no manifest (${UNREFERENCED_KINDS[kind]}); a restore ignores it\n`);
        }
        if (refused) {
          const where = flags.json ? "listed in unreferenced" : "listed above";
          throw new CheckpointError("invalid_checkpoint_state", `--strict: checkpoint ${report.checkpoint_id} holds files or directories no manifest names (${report.unreferenced.length}, ${where})`);
        }
      });
    });
}
