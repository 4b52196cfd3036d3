import { constants } from "node:os";
import type { Command } from "commander";
import { CheckpointError, toCheckpointError } from "../../../protocol/index.js";
import { runDemo, type DemoOptions } from "../../local/demo.js";
import { integerFlag, secondsFlag } from "../shared.js";

export function register(program: Command): void {
  program
    .command("demo")
    .description("a complete local run: nats-server, coordinator, reference Gym, a collection that is SIGKILLed mid-run and continues")
    .option("--rows <n>", "rows to collect", "60")
    .option("--concurrency <n>", "rows in flight at once", "8")
    .option("--checkpoint-every <s>", "seconds between timer checkpoints", "2")
    .option("--crash-after <share>", "share of rows finished before the crash", "0.4")
    .option("--token-delay-ms <ms>", "pace of the fake policy's streamed tokens", "60")
    .option("--keep", "keep the work directory (checkpoints, results, logs)")
    .action(async (flags: { rows: string; concurrency: string; checkpointEvery: string; crashAfter: string; tokenDelayMs: string; keep?: boolean }) => {
      const say = (line: string) => process.stdout.write(`[demo] ${line}\n`);
      let numbers: Pick<DemoOptions, "rows" | "concurrency" | "checkpointEvery" | "crashAfter" | "tokenDelayMs">;
      try {
        numbers = demoNumbers(flags);
      } catch (error) {
        const refusal = toCheckpointError(error);
        process.stderr.write(`error ${refusal.code}: ${refusal.message}\n`);
        process.exitCode = 2;
        return;
      }
      // The demo's clean-up (every process, NATS, the work directory) must also run on Ctrl-C,
      // SIGTERM and SIGHUP (its terminal closed): its Gym has its own process group, so a terminal's
      // Ctrl-C or hangup never reaches it, and nats-server takes SIGHUP as "reload the config".
      const abort = new AbortController();
      let signalled: NodeJS.Signals | undefined;
      const onSignal = (signal: NodeJS.Signals) => {
        // A second Ctrl-C while the clean-up runs must not end it halfway (the default action would,
        // leaving the work and NATS store directories): the first signal's stop is already under way.
        if (signalled) return;
        signalled = signal;
        // After a hangup, writing to the terminal fails (EIO): that must not end the clean-up.
        if (signal === "SIGHUP") for (const stream of [process.stdout, process.stderr]) stream.on("error", () => undefined);
        say(`${signal}: stopping every process and removing the work directory`);
        abort.abort();
      };
      const signals = ["SIGINT", "SIGTERM", "SIGHUP"] as const;
      // `on`, not `once`: after `once` fired, a repeat would get the default action.
      for (const signal of signals) process.on(signal, onSignal);
      try {
        const outcome = await runDemo({ ...numbers, keep: flags.keep === true, say, signal: abort.signal });
        process.exitCode = outcome.ok ? 0 : 1;
      } catch (error) {
        if (!signalled) say(`demo FAILED: ${error instanceof Error ? error.message : String(error)}`);
        process.exitCode = 1;
      }
      // Whatever the run was still waiting on is moot now; exit as the signal would have.
      if (signalled) process.exit(128 + constants.signals[signalled]);
      for (const signal of signals) process.off(signal, onSignal);
    });
}

/**
 * The demo's numbers, checked as `collect` and the policy backend check theirs, before anything
 * starts: a fractional --rows could never be matched by the rows finished (a sure "demo FAILED"),
 * and a value a child refuses would fail the demo only after nats-server and the Gym started.
 */
function demoNumbers(flags: { rows: string; concurrency: string; checkpointEvery: string; crashAfter: string; tokenDelayMs: string }) {
  const rows = integerFlag("rows", flags.rows, 1);
  const crashAfter = Number(flags.crashAfter);
  if (!/^\d*\.?\d+$/.test(flags.crashAfter.trim()) || !(crashAfter > 0 && crashAfter < 1)) {
    throw new CheckpointError("invalid_request", `--crash-after must be a share between 0 and 1, got ${JSON.stringify(flags.crashAfter)}`);
  }
  // The crash must leave rows to continue: with all of them finished the collector is gone before it.
  if (Math.ceil(rows * crashAfter) >= rows) {
    throw new CheckpointError("invalid_request", `--crash-after ${flags.crashAfter} of ${rows} rows leaves no row unfinished at the crash`);
  }
  return {
    rows,
    concurrency: integerFlag("concurrency", flags.concurrency, 1),
    checkpointEvery: secondsFlag("checkpoint-every", flags.checkpointEvery),
    crashAfter,
    tokenDelayMs: integerFlag("token-delay-ms", flags.tokenDelayMs, 0, 60_000),
  };
}
