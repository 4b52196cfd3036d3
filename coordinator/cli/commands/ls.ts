import type { Command } from "commander";
import { CheckpointCatalog } from "../../publication/checkpoint-catalog.js";
import { printJson, rootFrom, runCli } from "../shared.js";

export function register(program: Command): void {
  program
    .command("ls")
    .description("list published checkpoints under the checkpoint root (reads the filesystem)")
    .option("--root <dir>", "checkpoint root (env GYM_CKPT_CHECKPOINT_ROOT)")
    .option("--json", "print JSON")
    .action(async (flags: { root?: string; json?: boolean }) => {
      await runCli(async () => {
        const catalog = new CheckpointCatalog(rootFrom(flags.root));
        const [latest, { published }] = [await catalog.latest(), catalog.scan()];
        if (flags.json) return printJson({ latest, checkpoints: published });
        for (const c of published) {
          process.stdout.write(
            `${c.checkpoint_id === latest ? "*" : " "} ${c.checkpoint_id}  ${new Date(c.published_at * 1000).toISOString()}  epoch ${c.epoch}  ${c.participants} participants${c.stop ? "  stop" : ""}\n`,
          );
        }
      });
    });
}
