import type { Command } from "commander";
import { runParticipantProgram } from "../../local/participant-entry.js";

export function register(program: Command): void {
  program
    .command("gym")
    .description("start the reference Gym (policy backend, model attach proxy, resources, agent, environment) on loopback")
    .allowUnknownOption(true)
    .helpOption(false)
    .argument("[args...]", "passed to the reference Gym launcher (try --help)")
    .action(async (args: string[]) => {
      process.exitCode = await runParticipantProgram("gym/main", args);
    });
}
