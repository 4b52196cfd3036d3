import type { Command } from "commander";
import { CheckpointCatalog } from "../../publication/checkpoint-catalog.js";
import { catalogListing } from "../../publication/catalog-listing.js";
import { printJson, rootFrom, runCli } from "../shared.js";

export function register(program: Command): void {
  program
    .command("ls")
    .description("list published checkpoints under the checkpoint root (reads the filesystem)")
    .option("--root <dir>", "checkpoint root (env GYM_CKPT_CHECKPOINT_ROOT)")
    .option("--json", "print JSON")
    .action(async (flags: { root?: string; json?: boolean }) => {
      await runCli(async () => {
        const catalog = new CheckpointCatalog(rootFrom(flags.root, "list"));
        // A damaged LATEST or checkpoint still lists the others: ls is how an operator picks an older one to restore.
        const listing = await catalogListing(catalog);
        const { latest, latest_error: latestError, checkpoints: published, damaged = [] } = listing;
        for (const d of damaged) process.stderr.write(`warning ${d.code}: checkpoint ${d.checkpoint_id} is not listed: ${d.detail}\n`);
        if (latestError) process.stderr.write(`warning ${latestError.code}: ${latestError.detail} (no checkpoint is marked LATEST)\n`);
        if (flags.json) return printJson(listing);
        for (const c of published) {
          process.stdout.write(
            `${c.checkpoint_id === latest ? "*" : " "} ${c.checkpoint_id}  ${publishedAt(c.published_at)}  epoch ${c.epoch}  ${c.participants} participants${c.stop ? "  stop" : ""}\n`,
          );
        }
      });
    });
}

/**
 * The publication time as an ISO date; a (hand-edited or damaged) value past what a Date can hold
 * is printed as it is, so one checkpoint cannot make the whole listing fail.
 */
function publishedAt(seconds: number): string {
  const date = new Date(seconds * 1000);
  return Number.isNaN(date.getTime()) ? `published_at ${seconds}` : date.toISOString();
}
