import type { Command } from "commander";
import { runParticipantProgram } from "../../local/participant-entry.js";

export function register(program: Command): void {
  program
    .command("seeds")
    .description("export a published checkpoint's parked episodes as `continue` replay seeds: `gym-ckpt seeds --checkpoint DIR --out seeds.jsonl [--tasks tasks.jsonl]`")
    .allowUnknownOption(true)
    .helpOption(false)
    .argument("[args...]", "passed to the replay seeds exporter")
    .action(async (args: string[]) => {
      process.exitCode = await runParticipantProgram("replay/main", ["seeds", ...args]);
    });
}
