import { constants } from "node:os";
import type { Command } from "commander";
import { runDemo } from "../../local/demo.js";

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
      const numbers = { rows: Number(flags.rows), concurrency: Number(flags.concurrency), checkpointEvery: Number(flags.checkpointEvery), crashAfter: Number(flags.crashAfter), tokenDelayMs: Number(flags.tokenDelayMs) };
      if (!(numbers.rows >= 1 && numbers.concurrency >= 1 && numbers.checkpointEvery > 0 && numbers.crashAfter > 0 && numbers.crashAfter < 1 && numbers.tokenDelayMs >= 0)) {
        process.stderr.write("error invalid_request: --rows and --concurrency ≥ 1, --checkpoint-every > 0, 0 < --crash-after < 1, --token-delay-ms ≥ 0\n");
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
