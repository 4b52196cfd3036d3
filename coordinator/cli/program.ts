import { Command, CommanderError } from "commander";
import { PACKAGE_VERSION, PROTOCOL_VERSION } from "../../protocol/index.js";
import { dropOutputOfGoneReaders } from "./closed-output.js";

/** A CLI command module: `commands/<name>.ts` exports `register(program)`. */
export interface CommandModule {
  register(program: Command): void;
}

/**
 * Every command, one file each under `commands/`, in the order help lists them, by the name it
 * registers (a test checks both). Loaded on demand: a process loads the command it runs, all of them
 * only for help or a name it does not know. The build puts each in a chunk of its own
 * (deploy/bundle-entries.mjs), so `gym-ckpt status` does not parse the coordinator's HTTP server,
 * nor `collect` the checkpoint engine: Node parses a whole file before running it.
 */
export const COMMANDS = {
  attach: () => import("./commands/attach.js"),
  checkpoint: () => import("./commands/checkpoint.js"),
  collect: () => import("./commands/collect.js"),
  commit: () => import("./commands/commit.js"),
  coordinator: () => import("./commands/coordinator.js"),
  demo: () => import("./commands/demo.js"),
  forget: () => import("./commands/forget.js"),
  gym: () => import("./commands/gym.js"),
  ls: () => import("./commands/ls.js"),
  prepare: () => import("./commands/prepare.js"),
  publish: () => import("./commands/publish.js"),
  renew: () => import("./commands/renew.js"),
  restore: () => import("./commands/restore.js"),
  resume: () => import("./commands/resume.js"),
  retire: () => import("./commands/retire.js"),
  seeds: () => import("./commands/seeds.js"),
  status: () => import("./commands/status.js"),
  verify: () => import("./commands/verify.js"),
} satisfies Record<string, () => Promise<CommandModule>>;

type CommandName = keyof typeof COMMANDS;

function isCommandName(name: string | undefined): name is CommandName {
  return name !== undefined && Object.hasOwn(COMMANDS, name);
}

/**
 * Commander quotes an unknown option whole: a mistyped flag written with its value
 * (`--controller_token=$T`, the config key's spelling) would print the secret it was meant to
 * carry. The flag is kept, the value goes (up to the closing quote: the value may hold quotes and
 * newlines; commander's "did you mean" suggestion after it holds none).
 */
function withoutOptionValue(text: string): string {
  return text.replace(/^(error: unknown option '-[^=']*)=[\s\S]*'/, "$1=[Redacted]'");
}

/** The `gym-ckpt` program: with `only` a command's name, that command alone; otherwise all of them. */
export async function buildProgram(only?: string): Promise<Command> {
  const program = new Command("gym-ckpt")
    .description("Distributed checkpoint coordinator for Gym-style RL rollout servers, over NATS")
    .version(`${PACKAGE_VERSION} (protocol v${PROTOCOL_VERSION})`)
    .showHelpAfterError()
    // Bad usage is `invalid_request` with exit 2, like every other usage error (docs/api.md).
    .exitOverride()
    .configureOutput({ outputError: (text, write) => write(`error invalid_request: ${withoutOptionValue(text).replace(/^error: /, "")}`) });
  const names: CommandName[] = isCommandName(only) ? [only] : (Object.keys(COMMANDS) as CommandName[]);
  for (const command of await Promise.all(names.map((name) => COMMANDS[name]()))) command.register(program);
  return program;
}

/** Runs the command `argv` names (process.argv's shape). */
export async function runProgram(argv: string[]): Promise<void> {
  dropOutputOfGoneReaders();
  // The command is the first argument (options go after it); anything else (`--help`, `help`, a
  // mistyped name) gets every command, for the listing or commander's suggestion.
  const program = await buildProgram(argv[2]);
  try {
    await program.parseAsync(argv);
  } catch (error) {
    if (!(error instanceof CommanderError)) throw error;
    process.exit(error.exitCode === 0 ? 0 : 2); // help and --version exit 0; commander printed the rest
  }
}
