import { readdirSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";
import { dirname, join } from "node:path";
import { Command, CommanderError } from "commander";
import { PROTOCOL_VERSION } from "../../protocol/index.js";
import { dropOutputOfGoneReaders } from "./closed-output.js";

/** A CLI command module: `commands/<name>.ts` exports `register(program)`. */
export interface CommandModule {
  register(program: Command): void;
}

/**
 * The `gym-ckpt` program. Every command lives in its own file under `commands/`; this loads them all,
 * so adding a command never edits this file.
 */
export async function buildProgram(): Promise<Command> {
  const program = new Command("gym-ckpt")
    .description("Distributed checkpoint coordinator for Gym-style RL rollout servers, over NATS")
    .version(`0.1.0 (protocol v${PROTOCOL_VERSION})`)
    .showHelpAfterError()
    // Bad usage is `invalid_request` with exit 2, like every other usage error (docs/api.md).
    .exitOverride()
    .configureOutput({ outputError: (text, write) => write(`error invalid_request: ${text.replace(/^error: /, "")}`) });
  const dir = join(dirname(fileURLToPath(import.meta.url)), "commands");
  const files = readdirSync(dir)
    .filter((f) => (f.endsWith(".js") || f.endsWith(".ts")) && !f.endsWith(".d.ts") && !f.startsWith("_"))
    .sort();
  for (const file of files) {
    const mod = (await import(pathToFileURL(join(dir, file)).href)) as Partial<CommandModule>;
    if (typeof mod.register === "function") mod.register(program);
  }
  return program;
}

/** Runs the command `argv` names (process.argv's shape). */
export async function runProgram(argv: string[]): Promise<void> {
  dropOutputOfGoneReaders();
  const program = await buildProgram();
  try {
    await program.parseAsync(argv);
  } catch (error) {
    if (!(error instanceof CommanderError)) throw error;
    process.exit(error.exitCode === 0 ? 0 : 2); // help and --version exit 0; commander printed the rest
  }
}
