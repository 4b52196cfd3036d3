import { constants } from "node:fs";
import { open, rmdir, stat, unlink } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Command } from "commander";
import type { Logger } from "pino";
import { CheckpointError, MAX_ROLLOUT_ID_CHARS, connectNatsWithin, NATS_INBOX_PREFIXES, NATS_PING_OPTIONS, RecordKindSchema, assertRolloutEnv, isUnreadableStorage, makeDirectories, natsSettings, PACKAGE_VERSION, redactUrl } from "../../../protocol/index.js";
import { HttpControllerClient } from "../../client/http-controller-client.js";
import { CONTROLLER_CONNECT_FAILURE, NatsControllerClient } from "../../client/nats-controller-client.js";
import { listenForCheckpointSignals } from "../../collect/checkpoint-requests.js";
import { acquireCollectorLock, COLLECTOR_LOCK_FILE } from "../../collect/collector-lock.js";
import { DISPATCH_LOG_FILE } from "../../collect/dispatch-log.js";
import { endBySignal, handleEndingSignals, listenForEndingSignals, sigtermBeforeHandler, type EndingSignal } from "../../collect/ending-signals.js";
import { Collector, type CollectionSummary } from "../../collect/collector.js";
import { ProgressReporter } from "../../collect/progress-reporter.js";
import { assertConcurrencyFits } from "../../collect/scope-ceiling.js";
import { MAX_RUN_REPLY_MIB_LIMIT } from "../../collect/run-reply.js";
import { closeTaskRows, isRolloutIdPrefix, readTaskRows } from "../../collect/task-rows.js";
import { LOG_LEVELS, createLogger } from "../../telemetry/logger.js";
import { startTelemetry, type TelemetryHandle } from "../../telemetry/telemetry-sdk.js";
import { fetchableUrlFlag } from "../fetchable-url.js";
import { clientDeployment, clientToken, controllerHttpUrl, integerFlag, metricsPortFlag, runCli, secondsFlag, withClientOptions, type ClientFlags } from "../shared.js";

/** Exit code after a SIGTERM checkpoint: "temporary failure, requeue me" for schedulers such as Slurm. */
export const EXIT_REQUEUE = 75;
/** Ctrl-C and a closed terminal exit as the shell reports a process killed by them: 128 + the signal's number. */
const EXIT_BY_SIGNAL = { SIGINT: 130, SIGHUP: 129 } as const;

interface CollectFlags extends ClientFlags {
  tasks: string;
  out: string;
  checkpointDir: string;
  runUrl: string;
  concurrency: string;
  checkpointEvery?: string;
  checkpointTimeoutS: string;
  runTimeoutS: string;
  maxAttempts: string;
  maxRunReplyMib: string;
  progressIntervalS: string;
  logLevel: string;
  otlpEndpoint?: string;
  metricsPort?: string;
  recordsDir?: string;
  recordsEnv: string;
  recordsKind: string;
  recordsEveryRows: string;
  recordsEveryS: string;
  rolloutIdPrefix: string;
  newCollection?: boolean;
}

export function register(program: Command): void {
  withClientOptions(
    program
      .command("collect")
      .description("rollout collection with checkpoints: SIGUSR1 checkpoints, SIGTERM checkpoints and exits 75, a restart continues")
      .requiredOption("--tasks <file>", "tasks.jsonl: one task per line ({id, task} or a bare task object)")
      .requiredOption("--out <file>", "results.jsonl, appended as rows finish")
      .requiredOption("--checkpoint-dir <dir>", "the coordinator's checkpoint root (shared with it)")
      .requiredOption("--run-url <url>", "the environment (or legacy agent) server's /run URL")
      .option("--concurrency <n>", "rows in flight at once", "8")
      .option("--checkpoint-every <s>", "checkpoint every S seconds while rows are in flight")
      .option("--checkpoint-timeout-s <s>", "deadline of each checkpoint op", "60")
      .option("--run-timeout-s <s>", "timeout of one /run", "300")
      .option("--max-attempts <n>", "attempts per row before it counts as failed", "3")
      .option("--max-run-reply-mib <n>", `largest /run reply read, in MiB (a whole trajectory; at most ${MAX_RUN_REPLY_MIB_LIMIT})`, "64")
      .option("--progress-interval-s <s>", "seconds between progress lines when stderr is not a terminal", "10")
      .option("--log-level <level>", "pino log level", "warn")
      .option("--otlp-endpoint <url>", "OTLP/HTTP endpoint for traces and metrics (env OTEL_EXPORTER_OTLP_ENDPOINT)")
      .option("--metrics-port <port>", "serve Prometheus /metrics on this port, 0 = any free port (env OTEL_EXPORTER_PROMETHEUS_PORT)")
      .option("--records-dir <dir>", "also write finished rows as rollout records under DIR/rollouts/step_<N>/ (docs/replay.md)")
      .option("--records-env <name>", "env name in the record file names", "gym")
      .option("--records-kind <kind>", "train or eval", "eval")
      .option("--records-every-rows <n>", "write a step file every N finished rows", "64")
      .option("--records-every-s <s>", "…or S seconds after the first buffered row", "30")
      .option("--rollout-id-prefix <p>", "put P before every row's id: the rollout ids of a run of their own (docs/collect.md)", "")
      .option("--new-collection", "dispatched.jsonl is another collection's (other --tasks, --out or --rollout-id-prefix): abandon it (its unfinished attempts retired, its finished rows kept) instead of refusing to start"),
    { printsReply: false },
  ).action(async (flags: CollectFlags) => {
    // The CLI's entry listens before the program loads (cli/main.ts); here for a program built
    // otherwise. One arriving during start-up runs once started.
    const checkpointRequests = listenForCheckpointSignals();
    // Likewise a SIGTERM: kept until the handler below takes over (collect/ending-signals.ts).
    listenForEndingSignals();
    // Until the lock is held nothing is started, held or written: a SIGTERM by then ends the start-up
    // at once, "requeue me", rather than after a start (a restore, a leader to wait for) that would
    // only checkpoint what it restored, or never once a --tasks does not deliver.
    const sigterm = sigtermBeforeHandler();
    const requeueIfSigterm = () => {
      if (!sigterm.aborted) return;
      process.stderr.write(`SIGTERM before the start: nothing was started; exiting ${EXIT_REQUEUE} so the scheduler requeues\n`);
      process.exit(EXIT_REQUEUE);
    };
    let telemetryStarted = false;
    /** The ending signal being handled: its handler ends the process, with its own exit code. */
    let leaving: EndingSignal | undefined;
    /**
     * Which path ends the process, printing its outcome and setting the exit code: an ending signal
     * ("signal"), or the collection's own end, its summary or error ("main"), whichever starts first.
     * The other prints nothing and leaves the exit code alone: both would otherwise, racing (docs/collect.md).
     */
    let exitBy: "signal" | "main" | undefined;
    /**
     * Settles once the signal path has decided: true, it exits (75, 130, a hangup); false, a
     * SIGTERM hands the exit back to the collection (nothing checkpointed: a failed start, or the
     * collection had ended or failed), whose summary or error is the outcome.
     */
    let signalDecided!: (keeps: boolean) => void;
    const signalKeepsExit = new Promise<boolean>((resolve) => (signalDecided = resolve));
    /** Whether the main path (summary, error) ends the process: first come, or handed back by a SIGTERM. */
    const mainExits = async (): Promise<boolean> => {
      exitBy ??= "main";
      return exitBy === "main" || !(await signalKeepsExit);
    };
    await runCli(async () => {
      const env = process.env;
      // Without a reply to print, --json would be silently ignored.
      if (flags.json) throw new CheckpointError("invalid_request", "--json is not supported by collect: it prints a summary; finished rows are in --out");
      // Every flag and input file is checked before anything is created or connected.
      // Counts: a fraction would mean zero workers (--concurrency 0.5) or a half attempt.
      const concurrency = integerFlag("concurrency", flags.concurrency, 1);
      const maxAttempts = integerFlag("max-attempts", flags.maxAttempts, 1);
      const maxRunReplyBytes = integerFlag("max-run-reply-mib", flags.maxRunReplyMib, 1, MAX_RUN_REPLY_MIB_LIMIT) * 1024 * 1024;
      const recordsEveryRows = integerFlag("records-every-rows", flags.recordsEveryRows, 1);
      const leaderWaitMs = integerFlag("leader-wait-ms", flags.leaderWaitMs ?? "10000", 0);
      const metricsPort = metricsPortFlag(flags.metricsPort);
      const checkpointEverySeconds = flags.checkpointEvery === undefined ? undefined : secondsFlag("checkpoint-every", flags.checkpointEvery);
      const checkpointTimeoutSeconds = secondsFlag("checkpoint-timeout-s", flags.checkpointTimeoutS);
      const runTimeoutSeconds = secondsFlag("run-timeout-s", flags.runTimeoutS);
      const recordsEverySeconds = secondsFlag("records-every-s", flags.recordsEveryS);
      const progressIntervalSeconds = secondsFlag("progress-interval-s", flags.progressIntervalS);
      const logLevel = LOG_LEVELS.find((level) => level === flags.logLevel);
      if (!logLevel) throw new CheckpointError("invalid_request", `--log-level must be one of ${LOG_LEVELS.join(", ")}, got ${JSON.stringify(flags.logLevel)}`);
      const runUrl = fetchableUrlFlag("run-url", flags.runUrl);
      // The collector needs controller ops only, which the HTTP API serves as well.
      const httpUrl = controllerHttpUrl(flags, env);
      // As --run-url: the client's own checks come at its first call, after the lock.
      if (httpUrl !== undefined) fetchableUrlFlag("http-url", httpUrl);
      // Checked with or without --records-dir: a typo must not wait until records are switched on.
      try {
        assertRolloutEnv(flags.recordsEnv);
      } catch (error) {
        throw new CheckpointError("invalid_request", `--records-env: ${error instanceof Error ? error.message : String(error)}`);
      }
      if (!RecordKindSchema.safeParse(flags.recordsKind).success) throw new CheckpointError("invalid_request", "--records-kind must be train or eval");
      // The start of a rollout id; each row's whole id is checked as its line is read.
      if (!isRolloutIdPrefix(flags.rolloutIdPrefix)) {
        throw new CheckpointError("invalid_request", `--rollout-id-prefix must match ^[A-Za-z0-9][A-Za-z0-9._-]*$ and be shorter than ${MAX_ROLLOUT_ID_CHARS} characters`);
      }
      // resolve("") is the working directory: never a checkpoint root anyone meant.
      if (!flags.checkpointDir) throw new CheckpointError("invalid_request", "--checkpoint-dir must not be empty");
      // Likewise: records written into the working directory were never meant.
      if (flags.recordsDir === "") throw new CheckpointError("invalid_request", "--records-dir must not be empty");
      // After the flags (a bad one is invalid_request, exit 2, with or without a token), before any file.
      const deployment = clientDeployment(flags.deployment, env);
      const token = clientToken(flags.token, env);
      if (!token) throw new CheckpointError("unauthorized", "no controller token: pass --token or set GYM_CKPT_CONTROLLER_TOKEN (or GYM_CKPT_TOKEN, the deployment's shared token)");
      // The flags' values are checked first: a bad one is reported (exit 2) whatever the signal. The
      // files they name are looked at only while no SIGTERM has come (--tasks may never deliver).
      requeueIfSigterm();
      const outPath = resolve(flags.out);
      await assertAppendable(outPath, flags.tasks, resolve(flags.checkpointDir));
      if (flags.recordsDir !== undefined) await assertRecordsDir(resolve(flags.recordsDir));
      requeueIfSigterm();
      // Ended first on every way out, so what is printed next does not land on the live line (from
      // here: the tasks file's read draws on it).
      const progress = new ProgressReporter(process.stderr, progressIntervalSeconds * 1000);
      const rows = await readTaskRows(flags.tasks, {
        signal: sigterm,
        idPrefix: flags.rolloutIdPrefix,
        onProgress: (count, bytes) => progress.reading(flags.tasks, count, bytes),
      }).catch((error: unknown) => {
        progress.finish();
        requeueIfSigterm(); // the read given up
        throw error;
      });
      progress.readDone();
      // Nothing to run "finished" with exit 0: a tasks file left empty by a failed export, or the wrong one.
      if (!rows.length) throw new CheckpointError("invalid_request", `--tasks ${flags.tasks} has no rows`);
      const checkpointDir = resolve(flags.checkpointDir);
      // The tasks file stays open for the rows (their lines are read again as they are sent): closed
      // on every way out, here until release() takes over (the collector also closes it as it ends).
      const { createdDir, lock } = await (async () => {
        // Its ceiling depends on the rows' longest rollout id: checked once they are read, still before anything is created.
        assertConcurrencyFits(concurrency, rows);
        requeueIfSigterm();
        const createdDir = await ensureCheckpointDir(checkpointDir);
        requeueIfSigterm();
        // One collector per checkpoint root, before anything in it is read or written.
        return { createdDir, lock: await acquireCollectorLock(checkpointDir) };
      })().catch(async (error: unknown) => {
        await closeTaskRows(rows);
        throw error;
      });
      // One arriving while the lock was taken: let go of it (and the tasks file), then as for one that came before it.
      if (sigterm.aborted) {
        await lock.release();
        await closeTaskRows(rows);
      }
      requeueIfSigterm();
      let telemetry: TelemetryHandle | undefined;
      let nc: NatsConnection | undefined;
      // Every way out (a refusal at start-up, a failed run, the summary) lets go of the lock, the
      // NATS connection (it reconnects forever and would keep the process alive) and telemetry.
      let started = false;
      const release = async () => {
        // Not waited for: the close waits for the reads under way (FileHandle.close), and a failed
        // run() gives up a worker whose task line read hangs (a dead mount) after --run-timeout-s;
        // waiting here would hold the lock, and the error, for as long as that read. It closes once it ends.
        void closeTaskRows(rows);
        // A results.jsonl line whose write was given up but has begun may still land: collector.pid
        // stays, naming this process, so no start reads --out before that write ends (the process
        // cannot end before it either). Removed once it returns if this process is still there (a
        // failed collection ends when nothing is left to wait for); otherwise the next start takes
        // the file over as stale.
        if (collector?.resultsWriteUnderWay) {
          logger?.warn({ file: lock.path }, "collector.pid is left in place while a results.jsonl line's write is under way; it is removed once that write returns");
          void collector.resultsWriteEnded().then(() => lock.release()).catch(() => undefined);
        } else {
          await lock.release().catch(() => undefined);
        }
        // A start refused before it wrote anything (a --checkpoint-dir that is not the coordinator's
        // root, say) leaves no directory behind it made: only empty ones go.
        if (createdDir !== undefined && !started) await removeEmptyDirectories(checkpointDir, createdDir);
        await nc?.close().catch(() => undefined);
        await telemetry?.shutdown().catch(() => undefined);
      };
      let collector: Collector | undefined;
      let logger: Logger | undefined;
      // Settles with start-up (telemetry, NATS, the collector's start). A SIGTERM before then waits
      // for it; if the start fails, nothing was checkpointed: its refusal is the exit, not 75.
      let startedUp!: () => void;
      let startFailed!: (error: unknown) => void;
      let startSettled = false;
      const startup = new Promise<void>((resolve, reject) => {
        startedUp = resolve;
        startFailed = reject;
      }).finally(() => (startSettled = true));
      startup.catch(() => undefined); // surfaced by runCli
      // Handed over as soon as the lock is held (before it, a SIGTERM exits 75 as above, a SIGINT or
      // SIGHUP ends the process as by default: nothing is held yet). SIGTERM checkpoints with stop and exits 75; SIGINT and SIGHUP
      // stop at once and exit 130, or die by SIGHUP: the next start retires what was in flight. A second SIGTERM during
      // the stop checkpoint is ignored; a SIGINT or SIGHUP then cuts it short, the records flushed and the lock released.
      // Once an exit is decided (75 announced, or a SIGINT's or SIGHUP's), a further signal only hurries it.
      /**
       * The exit code once an ending signal's exit is decided: a SIGINT's or SIGHUP's as it arrives, a
       * SIGTERM's 75 once announced. A later signal changes it no more, only cuts the wait short.
       */
      let decidedCode: number | undefined;
      /** Set as leave() begins: a halt and flush still under way then were overtaken, and say and do nothing more. */
      let exitStarted = false;
      const leave = async (code: number) => {
        exitStarted = true;
        progress.finish();
        await release();
        // A hangup ends the process by SIGHUP itself, as its default action would, once the stop is
        // done: whoever started it (a shell, a session manager) sees a hangup, not an exit code.
        if (leaving === "SIGHUP" && endBySignal("SIGHUP")) return;
        process.exit(code);
      };
      const onSignal = (signal: EndingSignal) => {
        // The collection's summary or error is on its way out (bounded: a release, telemetry's 2 s).
        if (exitBy === "main") return void logger?.info({ signal }, "the collection is exiting with its own code; the signal changes nothing");
        if (leaving && signal === "SIGTERM") {
          if (leaving === "SIGTERM" && decidedCode === undefined) logger?.warn("SIGTERM again: the stop checkpoint is still running");
          return; // already leaving
        }
        // An exit decided already (a SIGINT's, a SIGHUP's, or the stop checkpoint's announced 75) owns
        // the outcome: this signal only cuts its halt and flush short, exiting at once with its code
        // (a halt and flush of its own would print a second "not written" line, and race its exit).
        if (decidedCode !== undefined) {
          if (exitStarted) return;
          logger?.warn({ signal, exit_code: decidedCode }, "exiting at once without waiting for the halt and the records flush");
          return void leave(decidedCode);
        }
        leaving = signal;
        exitBy = "signal";
        if (signal === "SIGTERM") {
          // Not expected to throw; if it did, the collection's own outcome is the exit rather than none.
          return void stopAndRequeue().catch((err: unknown) => {
            logger?.error({ err }, "SIGTERM handling failed");
            handBack();
          });
        }
        signalDecided(true);
        const code = EXIT_BY_SIGNAL[signal];
        // One during the stop checkpoint (not yet announced) cuts that short and takes over the exit,
        // but still writes the records of the rows --out has, as below.
        decidedCode = code;
        void (async () => {
          progress.finish();
          // No /run is sent and no row appended to --out from here on (the next start retires what
          // was in flight), so the flush after it writes the records of every row --out has. A timer
          // or SIGUSR1 checkpoint under way is resumed first: NATS closes at the exit, and nothing
          // else would resume it before the participants' lease expires. The appends, the tasks
          // file's close and the records flush are storage: waited for --run-timeout-s at most (the
          // appends and the close together, then the flush).
          await collector?.halt({ resumeCheckpoint: true }).catch(() => undefined);
          await collector?.flushRecords().catch(() => undefined);
          if (exitStarted) return; // a second signal cut this short: exiting already
          reportUnwrittenRecords();
          await leave(code);
        })();
      };
      const reportUnwrittenRecords = () => {
        const lost = collector?.summary().records;
        if (lost?.unwritten) process.stderr.write(`rollout records: ${lost.unwritten} finished rows not written (${lost.failedFlushes} failed flushes); they are in --out only\n`);
      };
      /** A SIGTERM that checkpointed nothing: the collection's own outcome (summary or error) is the exit. */
      const handBack = () => {
        if (leaving !== "SIGTERM") return; // a SIGINT or SIGHUP since: its exit is the one
        exitBy = "main";
        signalDecided(false);
      };
      const stopAndRequeue = async () => {
        // A failed start exits with its own refusal (runCli), the lock released on its way out.
        // Said, since a start may take long (a leader to wait for, a restore): the signal was heard.
        if (!startSettled) process.stderr.write("SIGTERM: the stop checkpoint follows once the start has ended\n");
        if (!(await startup.then(() => true, () => false))) return handBack();
        let failed = false;
        const result = await collector!.checkpoint({ stop: true }).catch((err: unknown) => {
          failed = true;
          logger?.error({ err }, "SIGTERM checkpoint failed");
          return { published: false, checkpointId: "" };
        });
        // A SIGINT or SIGHUP came meanwhile (it cut this checkpoint short): its exit is the one.
        if (leaving !== "SIGTERM") return;
        // Skipped, or given up or failed once the collection had ended (every row done or failed for
        // good, the last line perhaps still being appended; its summary being written; or its
        // failure, which gives up the checkpoint under way). Nothing was checkpointed, so the process
        // exits as the collection does, with its own code and summary or error, not 75.
        if (!result.published && collector!.hasEnded) {
          logger?.warn({ failed, checkpoint_id: result.checkpointId || undefined }, "SIGTERM after the collection ended: exiting with its own code");
          return handBack();
        }
        signalDecided(true);
        progress.finish();
        process.stderr.write(`stopped: checkpoint ${result.published ? `${result.checkpointId} published` : "not published"}; exiting ${EXIT_REQUEUE} so the scheduler requeues\n`);
        // Announced: 75 stands; a SIGINT or SIGHUP from here on only cuts the halt and flush short.
        decidedCode = EXIT_REQUEUE;
        // As on SIGINT: a row finishing after the flush would be in --out without its record.
        await collector?.halt().catch(() => undefined);
        await collector?.flushRecords().catch(() => undefined);
        if (exitStarted) return; // cut short by a SIGINT or SIGHUP: exiting already
        reportUnwrittenRecords();
        await leave(EXIT_REQUEUE);
      };
      handleEndingSignals(onSignal);
      let summary: CollectionSummary;
      let mean: number;
      try {
        telemetry = await startTelemetry({
          serviceName: "gym-ckpt-collect",
          ...(flags.otlpEndpoint !== undefined && { otlpEndpoint: flags.otlpEndpoint }), // an empty one is refused, not dropped
          ...metricsPort,
        });
        telemetryStarted = telemetry.started;
        if (telemetry.metricsUrl) process.stderr.write(`metrics ${telemetry.metricsUrl}\n`);
        logger = createLogger(logLevel);
        if (lock.tookOver) logger.warn({ file: lock.path, reason: lock.tookOver }, "took over the lock file of a collector that no longer runs");
        // NATS restarting as the collector starts (a node's processes coming back together) is
        // waited for as long as a controller call waits for a leader, not an exit.
        const natsOptions = { ...natsSettings(flags.natsUrl), ...NATS_PING_OPTIONS, maxReconnectAttempts: -1, inboxPrefix: NATS_INBOX_PREFIXES.controller };
        nc = httpUrl ? undefined : await connectNatsWithin(natsOptions, leaderWaitMs, CONTROLLER_CONNECT_FAILURE, logger);
        // The start line: which build collects what, through which controller endpoint (the NATS
        // server as connected, host:port; an HTTP URL without its query), before anything can fail.
        logger.info(
          { version: PACKAGE_VERSION, deployment, controller: nc ? nc.getServer() : redactUrl(httpUrl!), run_url: redactUrl(runUrl), checkpoint_dir: checkpointDir, rows: rows.length, concurrency },
          "collect started",
        );
        const controller = !nc ? new HttpControllerClient({ baseUrl: httpUrl!, token, leaderWaitMs }) : new NatsControllerClient({
          nc,
          deployment,
          token,
          leaderWaitMs,
        });
        collector = new Collector({
          rows,
          runUrl,
          outPath,
          // With --out, what dispatched.jsonl's header names: a start of another collection is refused, or abandons it.
          tasksPath: resolve(flags.tasks),
          rolloutIdPrefix: flags.rolloutIdPrefix,
          newCollection: flags.newCollection === true,
          checkpointDir,
          controller,
          concurrency,
          ...(checkpointEverySeconds !== undefined && { checkpointEverySeconds }),
          checkpointTimeoutSeconds,
          runTimeoutSeconds,
          maxAttempts,
          maxRunReplyBytes,
          ...(env.GYM_CKPT_TEST_CRASH_AT === "after-restore" && {
            // TEST-ONLY: die between the restore and the first dispatch.
            hooks: { afterRestore: () => void process.kill(process.pid, "SIGKILL") },
          }),
          ...(flags.recordsDir !== undefined && {
            records: {
              dir: resolve(flags.recordsDir),
              env: flags.recordsEnv,
              kind: RecordKindSchema.parse(flags.recordsKind),
              everyRows: recordsEveryRows,
              everySeconds: recordsEverySeconds,
            },
          }),
          progress,
          logger,
        });

        const running = collector;
        const log = logger;
        await running.start();
        started = true;
        startedUp();
        // Only now: a checkpoint taken mid-restore would race it. Not once a signal to leave came
        // (one remembered from start-up included): the stop checkpoint goes instead, or none.
        checkpointRequests.serve(() => {
          if (leaving) return;
          // Logged (warn, with its checkpoint_id) where it failed.
          void running.checkpoint({ stop: false }).catch((err: unknown) => log.debug({ err }, "SIGUSR1 checkpoint failed"));
        });
        summary = await running.run().catch(async (error: unknown) => {
          progress.finish();
          // A failed collection wrote what it could of its records; said only if its error is the outcome.
          if (await mainExits()) reportUnwrittenRecords();
          throw error;
        });
        // Ended after a signal (a halt leaves nothing to send): the signal's exit is the outcome, not this summary.
        if (!(await mainExits())) return;
        mean = await running.meanReward();
      } catch (error) {
        startFailed(error); // after start-up, settled already: nothing changes
        // The signal path ends the process and says why; this error (a start or run cut short by it, or a
        // failure racing its exit) would be a second outcome.
        if (!(await mainExits())) return;
        throw error;
      } finally {
        progress.finish();
        await release();
      }
      const u = summary.usage;
      const records = summary.records;
      process.stdout.write(
        [
          `rows: ${summary.rows} (finished ${summary.finished}, failed ${summary.failed}), mean reward ${Number.isNaN(mean) ? "n/a" : mean.toFixed(3)}`,
          // Why rows failed, so a task file the Gym refuses is named here and not only in the log.
          ...summary.failedRows.map((f) => `failed row ${f.rollout_id}: ${f.reason}`),
          ...(summary.failed > summary.failedRows.length ? [`(${summary.failed - summary.failedRows.length} more failed rows: see the log's "/run failed" and "/run refused the task" lines)`] : []),
          `checkpoints taken: ${summary.checkpoints}`,
          `rows continued from a checkpoint: ${summary.continued}, restarted from input: ${summary.restarted}`,
          ...(records
            ? [
                `rollout records: ${records.records} in ${records.steps} step files${records.skipped ? `, ${records.skipped} rows without a trajectory` : ""}` +
                  (records.failedFlushes ? `, ${records.failedFlushes} failed flushes` : "") +
                  (records.unwritten ? `; ${records.unwritten} finished rows NOT written (they are in --out only)` : ""),
              ]
            : []),
          // Only when the environment reports usage in its /run replies.
          ...(u.modelCallsKept + u.modelCallsRegenerated > 0
            ? [`model calls kept by continuation: ${u.modelCallsKept} (${u.tokensKept} generated tokens); regenerated: ${u.modelCallsRegenerated} (${u.tokensRegenerated} tokens)`]
            : []),
        ].join("\n") + "\n",
      );
      if (summary.failed > 0 || summary.finished < summary.rows || records?.unwritten) process.exitCode = 1;
    });
    // Its summary or refusal is out and telemetry was shut down (2 s at most): exit once stdout has
    // taken the summary (a refused write sets the exit code first: closed-output.ts), as the
    // coordinator daemon does, not when the event loop empties. An OTLP exporter still retrying its
    // last export (a collector down or not answering) kept the process up to 10 s more. An ending
    // signal's handler exits by itself, with its own code.
    if (telemetryStarted && exitBy !== "signal") process.stdout.write("", () => setImmediate(() => process.exit()));
  });
}

/**
 * `--checkpoint-dir` is an existing directory or one that can be created; anything else is a bad
 * flag. A stat or mkdir the storage refuses (EIO, EACCES, a stale handle) is thrown as it is,
 * storage_error (exit 1), as for `--out`: the mount needs fixing, not the path. Returns the first
 * directory it created, if any.
 */
async function ensureCheckpointDir(path: string): Promise<string | undefined> {
  const info = await stat(path).catch((error: NodeJS.ErrnoException) => {
    // Absent, or under a file (ENOTDIR): creating it says which.
    if (error.code === "ENOENT" || error.code === "ENOTDIR") return undefined;
    if (isUnreadableStorage(error)) throw error;
    throw new CheckpointError("invalid_request", `--checkpoint-dir ${path} is not accessible (${error.code ?? String(error)})`);
  });
  if (info && !info.isDirectory()) throw new CheckpointError("invalid_request", `--checkpoint-dir ${path} is not a directory`);
  if (info) return undefined;
  return makeDirectories(path).catch((error: NodeJS.ErrnoException) => {
    if (isUnreadableStorage(error)) throw error;
    throw new CheckpointError("invalid_request", `--checkpoint-dir ${path} cannot be created (${error.code ?? String(error)})`);
  });
}

/** Removes `path`, then its parents up to `top`, each only while it is empty; stops at the first that is not. */
async function removeEmptyDirectories(path: string, top: string): Promise<void> {
  for (let dir = path; ; dir = dirname(dir)) {
    if (!(await rmdir(dir).then(() => true, () => false)) || dir === top || dirname(dir) === dir) return;
  }
}

/**
 * `--records-dir` is an existing directory or one the records' start creates; a regular file (or a
 * path under one) is a bad flag, refused before the start rather than by its first mkdir, after the
 * lock. A look the storage refuses is thrown as it is, storage_error, as for `--checkpoint-dir`.
 */
async function assertRecordsDir(path: string): Promise<void> {
  const info = await stat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
    if (isUnreadableStorage(error)) throw error;
    throw new CheckpointError("invalid_request", `--records-dir ${path} is not accessible (${error.code ?? String(error)})`);
  });
  if (info && !info.isDirectory()) throw new CheckpointError("invalid_request", `--records-dir ${path} is not a directory`);
}

/**
 * `--out` is appended to: its directory must exist, and it must be a regular file if it does, and
 * not the `--tasks` file (its result lines would be read as tasks by the next start). A look the
 * storage refuses (EIO, EACCES, a stale handle) says nothing about the flag: thrown as it is,
 * storage_error (exit 1), so the operator fixes the mount, not the path.
 */
async function assertAppendable(path: string, tasksPath: string, checkpointDir: string): Promise<void> {
  const parent = await stat(dirname(path)).catch((error: unknown) => {
    if (isUnreadableStorage(error)) throw error;
    return undefined;
  });
  if (!parent?.isDirectory()) throw new CheckpointError("invalid_request", `--out: directory ${dirname(path)} does not exist`);
  const out = await stat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
    if (isUnreadableStorage(error)) throw error;
    throw new CheckpointError("invalid_request", `--out ${path} is not accessible (${error.code ?? String(error)})`);
  });
  if (out && !out.isFile()) throw new CheckpointError("invalid_request", `--out ${path} is not a regular file`);
  // Same file by device and inode, whatever the spelling (a link, a relative path). An unreadable --tasks is refused later.
  const tasks = out && (await stat(tasksPath).catch(() => undefined));
  if (tasks && tasks.dev === out.dev && tasks.ino === out.ino) throw new CheckpointError("invalid_request", `--out ${path} is the --tasks file`);
  // Results appended to the collector's own dispatch log or lock would break this start and every later one.
  for (const own of [DISPATCH_LOG_FILE, COLLECTOR_LOCK_FILE]) {
    const ownPath = join(checkpointDir, own);
    const ownFile = out && (await stat(ownPath).catch(() => undefined));
    if (path === ownPath || (ownFile && ownFile.dev === out.dev && ownFile.ino === out.ino)) {
      throw new CheckpointError("invalid_request", `--out ${path} is the collector's own ${own} in --checkpoint-dir`);
    }
  }
  await assertWritable(path, out !== undefined);
}

/**
 * Writing is tried, not judged from mode bits (root ignores them, a read-only mount or sysfs does
 * not): the file opened for appending, or, while absent, a file created and removed beside it, so
 * `--out` itself is not created before the start. Otherwise the first finished row found out, after
 * the lock, the dispatch log and that row's work.
 */
async function assertWritable(path: string, exists: boolean): Promise<void> {
  const probe = exists ? path : join(dirname(path), `.${basename(path)}.probe-${process.pid}`);
  try {
    await (await open(probe, exists ? constants.O_WRONLY | constants.O_APPEND : constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL)).close();
    if (!exists) await unlink(probe);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? String(error);
    // A refusal of the storage (EACCES, EROFS) is storage_error, as a stat's is; anything else (ENOENT
    // under /proc) is the flag's.
    throw new CheckpointError(isUnreadableStorage(error) ? "storage_error" : "invalid_request", `--out ${path} cannot be written (${code})`, { cause: error });
  }
}
