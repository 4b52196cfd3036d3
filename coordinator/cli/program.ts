import { Command, CommanderError } from "commander";
import { PACKAGE_VERSION, PROTOCOL_VERSION } from "../../protocol/index.js";
import { dropOutputOfGoneReaders } from "./closed-output.js";
import * as attachCommand from "./commands/attach.js";
import * as checkpointCommand from "./commands/checkpoint.js";
import * as collectCommand from "./commands/collect.js";
import * as commitCommand from "./commands/commit.js";
import * as coordinatorCommand from "./commands/coordinator.js";
import * as demoCommand from "./commands/demo.js";
import * as forgetCommand from "./commands/forget.js";
import * as gymCommand from "./commands/gym.js";
import * as lsCommand from "./commands/ls.js";
import * as prepareCommand from "./commands/prepare.js";
import * as publishCommand from "./commands/publish.js";
import * as renewCommand from "./commands/renew.js";
import * as restoreCommand from "./commands/restore.js";
import * as resumeCommand from "./commands/resume.js";
import * as retireCommand from "./commands/retire.js";
import * as seedsCommand from "./commands/seeds.js";
import * as statusCommand from "./commands/status.js";
import * as verifyCommand from "./commands/verify.js";

/** A CLI command module: `commands/<name>.ts` exports `register(program)`. */
export interface CommandModule {
  register(program: Command): void;
}

/**
 * Every command, one file each under `commands/`, in the order help lists them. Imported statically
 * so that the build bundles them into the binary (deploy/bundle-entries.mjs); a test checks that
 * every file there is listed.
 */
export const COMMANDS: readonly CommandModule[] = [
  attachCommand, checkpointCommand, collectCommand, commitCommand, coordinatorCommand, demoCommand,
  forgetCommand, gymCommand, lsCommand, prepareCommand, publishCommand, renewCommand,
  restoreCommand, resumeCommand, retireCommand, seedsCommand, statusCommand, verifyCommand,
];

/**
 * Commander quotes an unknown option whole: a mistyped flag written with its value
 * (`--controller_token=$T`, the config key's spelling) would print the secret it was meant to
 * carry. The flag is kept, the value goes (up to the closing quote: the value may hold quotes and
 * newlines; commander's "did you mean" suggestion after it holds none).
 */
function withoutOptionValue(text: string): string {
  return text.replace(/^(error: unknown option '-[^=']*)=[\s\S]*'/, "$1=[Redacted]'");
}

/** The `gym-ckpt` program. */
export function buildProgram(): Command {
  const program = new Command("gym-ckpt")
    .description("Distributed checkpoint coordinator for Gym-style RL rollout servers, over NATS")
    .version(`${PACKAGE_VERSION} (protocol v${PROTOCOL_VERSION})`)
    .showHelpAfterError()
    // Bad usage is `invalid_request` with exit 2, like every other usage error (docs/api.md).
    .exitOverride()
    .configureOutput({ outputError: (text, write) => write(`error invalid_request: ${withoutOptionValue(text).replace(/^error: /, "")}`) });
  for (const command of COMMANDS) command.register(program);
  return program;
}

/** Runs the command `argv` names (process.argv's shape). */
export async function runProgram(argv: string[]): Promise<void> {
  dropOutputOfGoneReaders();
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
  } catch (error) {
    if (!(error instanceof CommanderError)) throw error;
    process.exit(error.exitCode === 0 ? 0 : 2); // help and --version exit 0; commander printed the rest
  }
}
