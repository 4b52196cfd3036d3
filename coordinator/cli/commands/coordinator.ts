import type { Command } from "commander";
import { CheckpointError } from "../../../protocol/index.js";
import { loadConfig, redactConfig, splitList } from "../../config/config-loader.js";
import { startCoordinator, type CoordinatorHandle } from "../../daemon/coordinator-daemon.js";
import { newCoordinatorId } from "../../daemon/coordinator-id.js";
import type { EngineHooks } from "../../engine/checkpoint-engine.js";
import { createLogger } from "../../telemetry/logger.js";
import { observeLeadership, startTelemetry } from "../../telemetry/telemetry-sdk.js";
import { decimalInteger, metricsPortFlag, printJson, runCli } from "../shared.js";
import { exitAfterStop, listenForStop, type StartupPhase } from "../stop-signals.js";

/** The longest a stop signal during the lease campaign waits for start-up and the stop (a stalled NATS). */
const STOP_DURING_CAMPAIGN_MAX_MS = 10_000;

interface Flags {
  config?: string;
  deployment?: string;
  natsUrl?: string;
  token?: string;
  controllerToken?: string;
  checkpointRoot?: string;
  requireExistingRootClaim?: boolean;
  retention?: string;
  leaseMs?: string;
  defaultTimeoutMs?: string;
  httpHost?: string;
  httpPort?: string;
  http?: boolean;
  coordinatorId?: string;
  logLevel?: string;
  expect?: string;
  printConfig?: boolean;
  otlpEndpoint?: string;
  metricsPort?: string;
}

/**
 * A numeric config flag: decimal only (`--http-port ""` was port 0, `--retention 0x10` 16). The
 * config schema checks its range (and names where the value came from), so this message claims none.
 */
function num(name: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = decimalInteger(value);
  if (n === undefined) throw new CheckpointError("invalid_request", `--${name} must be a decimal integer, got ${JSON.stringify(value)}`);
  return n;
}

/**
 * TEST-ONLY fault injection: GYM_CKPT_TEST_CRASH_AT=before-decision|after-decision|during-publication
 * makes the daemon SIGKILL itself at that point of a checkpoint, so the suites can check what a
 * successor does (during-publication: after the overlapping resume, before checkpoint.json).
 */
function testHooks(): EngineHooks | undefined {
  const at = process.env.GYM_CKPT_TEST_CRASH_AT;
  if (!at) return undefined;
  const crash = () => {
    process.stderr.write(`GYM_CKPT_TEST_CRASH_AT=${at}: killing myself\n`);
    process.kill(process.pid, "SIGKILL");
  };
  switch (at) {
    case "before-decision":
      return { beforeDecision: crash };
    case "after-decision":
      return { afterDecision: crash };
    case "during-publication":
      // checkpoint.json is never written; the resume that overlaps the publication completes first
      return { beforePublication: () => new Promise<void>(() => undefined), afterResume: crash };
    default:
      return undefined;
  }
}

export function register(program: Command): void {
  program
    .command("coordinator")
    .description("run the coordinator daemon (config: defaults < --config file < env GYM_CKPT_* < flags)")
    .option("--config <file>", "JSON config file (env GYM_CKPT_CONFIG)")
    .option("--deployment <name>")
    .option("--nats-url <url>")
    .option("--token <token>", "participants' control token (env GYM_CKPT_TOKEN; better there: a command line is readable by every local user)")
    .option("--controller-token <token>", "controller API token (env GYM_CKPT_CONTROLLER_TOKEN; default: the participants' token)")
    .option("--checkpoint-root <dir>")
    .option("--require-existing-root-claim", "refuse to start while the checkpoint root holds no deployment claim (its storage not mounted yet)")
    .option("--retention <n>")
    .option("--lease-ms <ms>")
    .option("--default-timeout-ms <ms>")
    .option("--http-host <host>")
    .option("--http-port <port>")
    .option("--no-http", "do not serve the HTTP API")
    .option("--coordinator-id <id>")
    .option("--log-level <level>")
    .option("--expect <kind/instance,...>", "participants every checkpoint must include (env GYM_CKPT_EXPECTED_PARTICIPANTS)")
    .option("--print-config", "print the effective config (secrets redacted) and exit")
    .option("--otlp-endpoint <url>", "OTLP/HTTP endpoint for traces and metrics (env OTEL_EXPORTER_OTLP_ENDPOINT)")
    .option("--metrics-port <port>", "serve Prometheus /metrics on this port, 0 = any free port (env OTEL_EXPORTER_PROMETHEUS_PORT)")
    .action(async (flags: Flags, command: Command) => {
      // Credentials NATS refuses at start-up (`unauthorized`, the daemon's only source of it) are
      // configuration, like invalid_request: exit 2, which the systemd unit does not restart
      // (RestartPreventExitStatus=2), rather than exit 1 and a restart every 2 s for ever.
      await runCli(async () => {
        const metricsPort = metricsPortFlag(flags.metricsPort);
        const httpSource = command.getOptionValueSource("http");
        const config = loadConfig({
          file: flags.config,
          flags: {
            deployment: flags.deployment,
            "nats.servers": flags.natsUrl,
            token: flags.token,
            controller_token: flags.controllerToken,
            checkpoint_root: flags.checkpointRoot,
            require_existing_root_claim: flags.requireExistingRootClaim,
            retention: num("retention", flags.retention),
            lease_ms: num("lease-ms", flags.leaseMs),
            default_timeout_ms: num("default-timeout-ms", flags.defaultTimeoutMs),
            "http.host": flags.httpHost,
            "http.port": num("http-port", flags.httpPort),
            "http.enabled": httpSource === "cli" ? flags.http : undefined,
            coordinator_id: flags.coordinatorId,
            log_level: flags.logLevel,
            expected_participants: flags.expect === undefined ? undefined : splitList(flags.expect),
          },
        });
        if (flags.printConfig) {
          printJson(redactConfig(config));
          return;
        }
        let phase: StartupPhase = "preparing";
        const stopRequested = listenForStop(() => phase, Math.min(config.lease_ms, STOP_DURING_CAMPAIGN_MAX_MS));
        // One id for the lease, the logs and the telemetry resource (service.instance.id): chosen
        // here when unset, since telemetry starts before the daemon.
        const coordinatorId = config.coordinator_id ?? newCoordinatorId();
        // Before the coordinator creates its instruments; docs/telemetry.md.
        const telemetry = await startTelemetry({
          serviceName: "gym-ckpt-coordinator",
          serviceInstanceId: coordinatorId,
          ...(flags.otlpEndpoint !== undefined && { otlpEndpoint: flags.otlpEndpoint }), // an empty one is refused, not dropped
          ...metricsPort,
        });
        if (telemetry.metricsUrl) process.stdout.write(`metrics ${telemetry.metricsUrl}\n`);
        const logger = createLogger(config.log_level);
        const hooks = testHooks();
        let handle: CoordinatorHandle;
        try {
          handle = await startCoordinator({
            config: { ...config, coordinator_id: coordinatorId },
            logger,
            ...(hooks && { hooks }),
            beforeCampaign: () => (phase = "campaigning"),
          });
        } catch (error) {
          // Its metrics server would keep the process alive after the refusal is printed.
          await telemetry.shutdown().catch(() => undefined);
          throw error;
        }
        phase = "running";
        observeLeadership(() => handle.lease.state());
        if (handle.httpUrl) process.stdout.write(`http ${handle.httpUrl}\n`);
        // A stop signal that came during start-up stops it now.
        const ended = await Promise.race([stopRequested.then((signal) => ({ signal })), handle.closed.then((closedBy) => ({ closedBy }))]);
        if ("closedBy" in ended) {
          // maxReconnectAttempts is unlimited, so this is fatal: exit and let the supervisor restart us.
          // With the error that closed it (an authorization revoked by a config reload), if any.
          logger.fatal({ err: ended.closedBy }, "nats_connection_closed");
          process.exitCode = 1;
          // Stopped like on SIGTERM: its HTTP server (and lease timers) would keep the process
          // alive, answering /healthz ok, and the supervisor would never restart it.
          await handle.stop("nats_connection_closed").catch((err: unknown) => logger.error({ err }, "coordinator_stop_failed"));
          await telemetry.shutdown();
          process.exit();
        }
        await handle.stop(ended.signal);
        await telemetry.shutdown();
        // Now, not when the event loop empties: an OTLP exporter still retrying its last export
        // (a collector that refuses or never answers) would keep the process up to 10 s more.
        exitAfterStop(ended.signal);
      }, ["unauthorized"]);
    });
}
