#!/usr/bin/env node
/**
 * The `gym-ckpt` binary's entry, tiny on purpose. ESM runs a module's static imports before its
 * body, and loading the program (commander, every command and their dependencies) takes hundreds
 * of milliseconds; until a SIGUSR1 listener exists, Node's default action opens the V8 inspector
 * on 127.0.0.1:9229, where any local user could run code in a process that holds a controller
 * token. So the listener comes first, importing nothing but a module with no imports, and the
 * program loads after it. The build bundles the program, not this file (deploy/bundle-entries.mjs):
 * Node parses a whole file before running its first line, and a bundle takes ~0.3 s.
 */
import { listenForCheckpointSignals } from "../collect/checkpoint-requests.js";
import { listenForEndingSignals } from "../collect/ending-signals.js";

// `collect` checkpoints on SIGUSR1, and keeps one arriving while it loads for when it has started.
// Every other command ignores it: a SIGUSR1 meant for a collector often reaches a whole process
// group or job, coordinator daemon included, and must not open an inspector there either
// (debugging: start node with --inspect).
// A SIGTERM too: one arriving while it loads ends its start-up with exit 75 once the command runs,
// not a death by signal a scheduler would not requeue (collect/ending-signals.ts).
if (process.argv[2] === "collect") {
  listenForCheckpointSignals();
  listenForEndingSignals();
} else process.on("SIGUSR1", () => undefined);

const { runProgram } = await import("./program.js");
await runProgram(process.argv);
