import type { Command } from "commander";
import { runParticipantProgram } from "../../local/participant-entry.js";
import { GYM_SECRET_FLAGS, secretFlagsToEnv } from "../../local/secret-flags-to-env.js";

export function register(program: Command): void {
  program
    .command("gym")
    .description("start the reference Gym (policy backend, model attach proxy, resources, agent, environment) on loopback")
    .allowUnknownOption(true)
    .helpOption(false)
    .argument("[args...]", "passed to the reference Gym launcher (try --help)")
    .action(async (args: string[]) => {
      // --nats and --token reach it in the environment: its command line is readable by every local user.
      const forwarded = secretFlagsToEnv(args, GYM_SECRET_FLAGS);
      process.exitCode = await runParticipantProgram("gym/main", forwarded.args, forwarded.env);
    });
}
