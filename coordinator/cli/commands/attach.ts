import type { Command } from "commander";
import { runParticipantProgram } from "../../local/participant-entry.js";
import { ATTACH_SECRET_FLAGS, secretFlagsToEnv } from "../../local/secret-flags-to-env.js";

export function register(program: Command): void {
  program
    .command("attach")
    .description("join a server we do not own to checkpoints through an attach proxy: `gym-ckpt attach model --upstream URL --listen HOST:PORT`")
    .allowUnknownOption(true)
    .helpOption(false)
    .argument("<kind>", "model")
    .argument("[args...]", "passed to the attach proxy (`gym-ckpt attach model --help` lists its flags)")
    .action(async (kind: string, args: string[], _options: unknown, command: Command) => {
      // The help option is off so `attach model --help` reaches the proxy; `attach --help` is ours.
      if (kind === "--help" || kind === "-h") {
        command.outputHelp();
        return;
      }
      if (kind !== "model") {
        process.stderr.write(`error invalid_request: only \`attach model\` exists (got ${JSON.stringify(kind)})\n`);
        process.exitCode = 2;
        return;
      }
      // --nats, --token and --cut-token reach it in the environment: its command line is readable by every local user.
      const forwarded = secretFlagsToEnv(args, ATTACH_SECRET_FLAGS);
      process.exitCode = await runParticipantProgram("attach/main", forwarded.args, forwarded.env);
    });
}
