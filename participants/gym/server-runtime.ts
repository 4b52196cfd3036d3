import { isAbsolute } from "node:path";
import { parseArgs } from "node:util";
import type { ConnectionOptions, NatsConnection } from "@nats-io/transport-node";
import pino, { type Logger } from "pino";
import { z } from "zod";
import type { FastifyInstance } from "fastify";
import { BearerTokenSchema, CheckpointError, dieByHangup, finishedWithin, DeploymentSchema, InstanceSchema, describeZodError, toCheckpointError, DEFAULT_NATS_URL, MAX_TIMER_MS, PACKAGE_VERSION, envSetting, isHttpUrl, NATS_INBOX_PREFIXES, NATS_PING_OPTIONS, natsSettings, type RecordBase } from "../../protocol/index.js";
import type { ParticipantKind } from "../control-plane/participant-kind.js";
import { startParticipant, type ParticipantHandle } from "../control-plane/start-participant.js";
import { propagateHttpTraceContext } from "../telemetry/http-propagation.js";
import { traceLogFields } from "../telemetry/log-correlation.js";
import { startTelemetry, type TelemetryHandle } from "../telemetry/telemetry-sdk.js";
import { LOG_REDACT_CENSOR, LOG_REDACT_PATHS } from "../../protocol/log-redaction.js";
import { loggedError } from "../../protocol/logged-error.js";
import { endLogsWhenStdoutRefuses } from "../../protocol/stdout-log-refusal.js";
import { connectNatsWithin, DEFAULT_NATS_CONNECT_WAIT_MS, MAX_NATS_CONNECT_WAIT_MS } from "../../protocol/nats-first-connect.js";
import { logNatsStatus } from "../../protocol/nats-status-log.js";
import { isListenRefusal } from "../../protocol/listen-refusal.js";
import { STOP_WITH_LAUNCHER_ENV } from "./gym-launcher.js";

/**
 * The shared shell of every reference Gym server process: common flags, a NATS connection,
 * a pino logger, the ready line launchers wait for, and a clean shutdown on SIGTERM/SIGINT/SIGHUP.
 *
 * Flags (env fallback in brackets): --nats [GYM_CKPT_NATS_URL], --nats-connect-wait-ms
 * [GYM_CKPT_NATS_CONNECT_WAIT_MS], --deployment [GYM_CKPT_DEPLOYMENT],
 * --instance, --token [GYM_CKPT_TOKEN], --port (0 = any free port), --checkpoint-root
 * [GYM_CKPT_CHECKPOINT_ROOT], --lease-grace-seconds, --otlp-endpoint [OTEL_EXPORTER_OTLP_ENDPOINT],
 * --metrics-port (Prometheus /metrics; 0 = any free port) [OTEL_EXPORTER_PROMETHEUS_PORT], plus
 * server-specific string flags; --help prints them and exits 0. Telemetry: see
 * participants/telemetry/telemetry-sdk.ts.
 */
/**
 * A number on the command line: decimal only, like every gym-ckpt flag (docs/api.md §5). z.coerce
 * would take `--port ""` (an unset "$PORT") as 0, "any free port", which is the flag left out, and
 * `0x1F90` or `1e3` as what Number() makes of them.
 */
const decimalFlag = (pattern: RegExp, what: string) =>
  z
    .string()
    .refine((value) => pattern.test(value), `must be ${what}`)
    .transform(Number);
const portFlag = decimalFlag(/^\d+$/, "a decimal port number").pipe(z.number().int().min(0).max(65535));

export const ServerFlagsSchema = z
  .object({
    nats: z.string().min(1),
    natsConnectWaitMs: decimalFlag(/^\d+$/, "a whole number of milliseconds").pipe(z.number().int().max(MAX_NATS_CONNECT_WAIT_MS)),
    deployment: DeploymentSchema,
    instance: InstanceSchema,
    token: z.string().min(1, "a control token is required (--token or GYM_CKPT_TOKEN)").pipe(BearerTokenSchema),
    port: portFlag,
    checkpointRoot: z.string().refine(isAbsolute, "must be an absolute path (as the coordinator's: checkpoint directories arrive absolute)").optional(),
    leaseGraceSeconds: decimalFlag(/^\d+(\.\d+)?$/, "a decimal number of seconds").pipe(z.number().positive()).optional(),
    otlpEndpoint: z.url().optional(),
    metricsPort: portFlag.optional(),
  })
  .strict();

/** How long a stopping server lets in-flight requests finish before it closes their connections. */
export const SHUTDOWN_DRAIN_MS = 2_000;

/**
 * How long a stopping server waits for its NATS connection to drain before closing it. With NATS
 * down a drain cannot finish (a reconnect attempt to a host that does not answer waits out its
 * connect timeout): the stop, bounded, stays inside the Gym launcher's 5 s grace before SIGKILL.
 */
export const NATS_DRAIN_WAIT_MS = 1_000;


/** Drains `nc`, closing it instead once NATS_DRAIN_WAIT_MS passed (or the drain failed); never rejects. */
async function drainWithin(nc: NatsConnection): Promise<void> {
  if (!(await finishedWithin(nc.drain(), NATS_DRAIN_WAIT_MS).catch(() => false))) await nc.close().catch(() => undefined);
}
export type CommonServerConfig = z.infer<typeof ServerFlagsSchema>;

/** The common flags `gym-ckpt gym` passes on to every server: checked once there, before any starts. */
export const LaunchFlagsSchema = ServerFlagsSchema.pick({ nats: true, natsConnectWaitMs: true, deployment: true, token: true, checkpointRoot: true, leaseGraceSeconds: true });

export interface ServerRuntime {
  config: CommonServerConfig;
  /** Server-specific flags, as given. */
  extra: Record<string, string | undefined>;
  nc: NatsConnection;
  logger: Logger;
  telemetry: TelemetryHandle;
  /** Print the line launchers wait for: {"ready":true,"name":…,"url":…}. */
  announceReady(url: string): void;
  /** Register clean-up run on SIGTERM/SIGINT before exit (the last registered first). */
  onShutdown(fn: () => Promise<void> | void): void;
  /**
   * Register what runs the moment shutdown begins, before any clean-up step: the first of those
   * may wait for a start-up still under way, and a server should not take new work meanwhile.
   */
  onStopping(fn: () => void): void;
  /**
   * The usual ending of a server's main: listen on 127.0.0.1 at the configured port, attach the
   * participant to NATS, stop both on shutdown, then print the ready line. Returns the URL.
   */
  serve<R extends RecordBase>(app: FastifyInstance, adapter: ParticipantKind<R>): Promise<string>;
  /**
   * Awaits a server's listen. A failure (the port in use, an address not on this host) prints one
   * line, `<name>: internal_error: listen EADDRINUSE: … <host>:<port>`, and exits 1 after closing
   * NATS and telemetry, never a stack trace. The Gym launcher reads EADDRINUSE and the port there.
   */
  listening<T>(listen: Promise<T>): Promise<T>;
  /**
   * Attaches `adapter` as this server's participant. A refusal (another live process serves this
   * kind/instance: `instance_conflict`) prints one line and exits 1, for the supervisor to report.
   * So does losing the name later (another process took it over while this one was cut off from
   * NATS), after the same clean shutdown as SIGTERM. A signal while it starts: the shutdown stops
   * it once started and exits 0; the returned promise never settles then.
   */
  participate<R extends RecordBase>(adapter: ParticipantKind<R>): Promise<ParticipantHandle<R>>;
}

/**
 * Stops accepting, gives in-flight requests SHUTDOWN_DRAIN_MS to finish, then closes what is left:
 * a request that never ends (parked for a checkpoint nobody resumes, a held response) would hold
 * app.close() and the process for ever.
 */
export async function closeWithDrain(app: FastifyInstance, logger: Logger): Promise<void> {
  const forced = setTimeout(() => {
    // close() already ended the idle connections: what is left are requests still running, whose
    // callers now see the connection close. Said in the log, not dropped silently.
    app.server.getConnections((_error, connections) => {
      if (connections > 0) logger.warn({ connections, drain_ms: SHUTDOWN_DRAIN_MS }, "shutdown: requests still running after the drain are cut");
    });
    app.server.closeAllConnections();
  }, SHUTDOWN_DRAIN_MS);
  await app.close();
  clearTimeout(forced);
}

/** The `--help` text: the common flags with their defaults and env fallbacks, then the server's own. */
function usage(name: string, extraFlags: string[]): string {
  const lines = [
    `usage: ${name} [flags]`,
    "  --nats URL                NATS server(s), comma-separated (env GYM_CKPT_NATS_URL, default nats://127.0.0.1:4222);",
    "                            credentials from env GYM_CKPT_NATS_USER + GYM_CKPT_NATS_PASS, or GYM_CKPT_NATS_TOKEN",
    `  --nats-connect-wait-ms N  at start, wait up to N ms for NATS to accept connections (env GYM_CKPT_NATS_CONNECT_WAIT_MS, default ${DEFAULT_NATS_CONNECT_WAIT_MS})`,
    "  --deployment NAME         deployment name (env GYM_CKPT_DEPLOYMENT, default default)",
    `  --instance NAME           this server's name in the deployment (default ${name})`,
    "  --token TOKEN             participants' control token (env GYM_CKPT_TOKEN, required)",
    "  --port N                  port on 127.0.0.1 (default 0: any free port)",
    "  --checkpoint-root DIR     refuse commits and restores outside DIR (env GYM_CKPT_CHECKPOINT_ROOT)",
    "  --lease-grace-seconds N   resume by itself N s after a message's deadline (default 600)",
    "  --otlp-endpoint URL       OTLP/HTTP traces and metrics (env OTEL_EXPORTER_OTLP_ENDPOINT)",
    "  --metrics-port N          Prometheus /metrics, 0 = any free port (env OTEL_EXPORTER_PROMETHEUS_PORT)",
  ];
  if (extraFlags.length) lines.push(`${name} flags: ${extraFlags.map((flag) => `--${flag} VALUE`).join(" ")}`);
  return `${lines.join("\n")}\n`;
}

function parseServerArgs(argv: string[], extraFlags: string[]) {
  return parseArgs({
    args: argv,
    strict: true,
    options: {
      nats: { type: "string" },
      "nats-connect-wait-ms": { type: "string" },
      deployment: { type: "string" },
      instance: { type: "string" },
      token: { type: "string" },
      port: { type: "string" },
      "checkpoint-root": { type: "string" },
      "lease-grace-seconds": { type: "string" },
      "otlp-endpoint": { type: "string" },
      "metrics-port": { type: "string" },
      help: { type: "boolean" },
      ...Object.fromEntries(extraFlags.map((flag) => [flag, { type: "string" as const }])),
    },
  });
}

/**
 * Why the command line could not be parsed, naming a flag at most, never a value: a token with a
 * space passed unquoted (`--token $T`) leaves the rest of the secret as a stray argument.
 */
export function argvRefusal(error: unknown): string {
  const { code, message } = error as { code?: string; message?: string };
  const flag = /'(--?[A-Za-z0-9-]+)/.exec(message ?? "")?.[1];
  if (code === "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL") return "unexpected argument: every value follows its flag (quote a value that holds spaces)";
  if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") return `unknown option${flag ? ` ${flag}` : ""} (see --help)`;
  if (code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE") {
    // `--token-delay-ms -1`: the parser takes a value beginning with "-" for the next flag.
    const dashed = /ambiguous/.test(message ?? "") && flag ? `; one beginning with "-" is written ${flag}=<value>` : "";
    return `option${flag ? ` ${flag}` : ""} needs a value${dashed}`;
  }
  return "the command line cannot be parsed (see --help)";
}

/** What a start-up step awaits once a signal's shutdown runs: it ends the process, nothing goes on. */
function never(): Promise<never> {
  return new Promise<never>(() => undefined);
}


/**
 * Why a server's own `--*-ms` flag (`--episode-timeout-ms`, `--cut-timeout-ms`, `--token-delay-ms`)
 * is refused, if it is: every one is a decimal count of milliseconds a timer can hold, checked with
 * the common flags (before NATS), instead of `abc` becoming NaN (a timeout that fires at once).
 */
export function millisecondFlagRefusal(values: Record<string, unknown>): string | undefined {
  for (const [flag, value] of Object.entries(values)) {
    if (!flag.endsWith("-ms") || value === undefined) continue;
    if (typeof value !== "string" || !/^\d+(\.\d+)?$/.test(value) || Number(value) > MAX_TIMER_MS) return `--${flag} must be a decimal number of milliseconds from 0 to ${MAX_TIMER_MS}`;
  }
  return undefined;
}

/**
 * The episode deadline of `--episode-timeout-ms` (the environment server, the agent's legacy /run):
 * undefined when left out or 0, no deadline, as a 0 lifetime or wait is elsewhere. Taken as a 0 ms
 * deadline, it failed every /run `deadline_exceeded` before its first call.
 */
export function episodeTimeoutFlag(extra: Record<string, string | undefined>): number | undefined {
  const value = Number(extra["episode-timeout-ms"] ?? 0);
  return value > 0 ? value : undefined;
}

/**
 * Why a server's required URL flags are refused, if they are: missing, or not http(s) (a URL fetch
 * cannot take, such as `127.0.0.1:8080` without its scheme, would fail every call at run time), or
 * carrying credentials (`user:password@`): fetch refuses to build a request from such a URL, and
 * its refusal quotes the whole URL, password included, into the reply and the logs of every call.
 * The value is never echoed.
 */
export function urlFlagsRefusal(flags: Record<string, string | undefined>, names: string[]): string | undefined {
  if (names.some((flag) => !flags[flag])) return `${names.map((flag) => `--${flag}`).join(" and ")} are required`;
  const bad = names.find((flag) => !isHttpUrl(flags[flag]!));
  if (bad !== undefined) return `--${bad} must be an http or https URL`;
  const withCredentials = names.find((flag) => urlHasCredentials(flags[flag]!));
  return withCredentials === undefined ? undefined : `--${withCredentials} may not carry credentials (user:password@)`;
}

/** Whether an http(s) URL carries `user[:password]@` (which fetch refuses, quoting the URL). */
export function urlHasCredentials(value: string): boolean {
  const url = new URL(value);
  return url.username !== "" || url.password !== "";
}

/** Why a bearer token from `where` (`--cut-token`, a variable) is refused, if it is: what `Authorization: Bearer` cannot carry. */
function tokenRefusal(where: string, value: string | undefined): string | undefined {
  const parsed = value === undefined ? undefined : BearerTokenSchema.safeParse(value);
  return parsed && !parsed.success ? `${where}: ${parsed.error.issues[0]!.message}` : undefined;
}

/**
 * The generation-cut endpoint's bearer token of the policy backend and the attach proxy:
 * `--cut-token`, else GYM_CKPT_CUT_TOKEN (a command line is readable by every local user, so a cut
 * token of its own needs a variable, as the control token has GYM_CKPT_TOKEN), else undefined (the
 * control token). `refusal` is set when it could never authenticate, naming where it came from.
 */
export function cutTokenSetting(flags: Record<string, string | undefined>): { token: string | undefined; refusal: string | undefined } {
  const flag = flags["cut-token"];
  if (flag !== undefined) return { token: flag, refusal: tokenRefusal("--cut-token", flag) };
  const token = envSetting("GYM_CKPT_CUT_TOKEN");
  return { token, refusal: tokenRefusal("GYM_CKPT_CUT_TOKEN", token) };
}

/**
 * How a participant program connects to NATS: for as long as it runs, reconnecting after any
 * outage, and giving up a connection gone silent within about 40 s (NATS_PING_OPTIONS), as the
 * coordinator does: its membership entry expires after 15 s, so it is out of every checkpoint
 * until it reconnects and announces itself again. Its replies come under the gym role's inbox
 * prefix, the only one a Gym server's NATS user may subscribe to (NATS_INBOX_PREFIXES).
 */
export function participantConnectOptions(nats: string, connectionName: string): ConnectionOptions & { inboxPrefix: string } {
  return { ...natsSettings(nats), ...NATS_PING_OPTIONS, name: connectionName, maxReconnectAttempts: -1, reconnectTimeWait: 250, inboxPrefix: NATS_INBOX_PREFIXES.gym };
}

/**
 * `checkExtra` checks the server's own flags with the common ones, before NATS: a refusal (one
 * line, printed after `<name>: `) is exit 2. Checked after connecting, a bad flag was answered
 * `unreachable`, exit 1, whenever NATS was down, which a supervisor restarts for ever.
 */
export async function startServerRuntime(
  name: string,
  argv: string[],
  extraFlags: string[] = [],
  checkExtra?: (extra: Record<string, string | undefined>, config: CommonServerConfig) => string | undefined | Promise<string | undefined>,
): Promise<ServerRuntime> {
  let args: ReturnType<typeof parseServerArgs>;
  try {
    args = parseServerArgs(argv, extraFlags);
  } catch (error) {
    process.stderr.write(`${name}: invalid configuration: ${argvRefusal(error)}\n`);
    process.exit(2);
  }
  const { values } = args;
  if (values.help) {
    process.stdout.write(usage(name, extraFlags));
    process.exit(0);
  }
  const badMilliseconds = millisecondFlagRefusal(values);
  if (badMilliseconds) {
    process.stderr.write(`${name}: invalid configuration: ${badMilliseconds}\n`);
    process.exit(2);
  }
  const parsed = ServerFlagsSchema.safeParse({
    nats: values.nats ?? envSetting("GYM_CKPT_NATS_URL") ?? DEFAULT_NATS_URL,
    natsConnectWaitMs: values["nats-connect-wait-ms"] ?? envSetting("GYM_CKPT_NATS_CONNECT_WAIT_MS") ?? String(DEFAULT_NATS_CONNECT_WAIT_MS),
    deployment: values.deployment ?? envSetting("GYM_CKPT_DEPLOYMENT") ?? "default",
    instance: values.instance ?? name,
    token: values.token ?? envSetting("GYM_CKPT_TOKEN") ?? "",
    port: values.port ?? "0",
    checkpointRoot: values["checkpoint-root"] ?? envSetting("GYM_CKPT_CHECKPOINT_ROOT"),
    leaseGraceSeconds: values["lease-grace-seconds"],
    otlpEndpoint: values["otlp-endpoint"],
    metricsPort: values["metrics-port"],
  });
  if (!parsed.success) {
    process.stderr.write(`${name}: invalid configuration: ${describeZodError(parsed.error)}\n`);
    process.exit(2);
  }
  const config = parsed.data;
  const extra = Object.fromEntries(extraFlags.map((flag) => [flag, (values as Record<string, string | undefined>)[flag]]));
  const badExtra = await checkExtra?.(extra, config);
  if (badExtra !== undefined) {
    process.stderr.write(`${name}: ${badExtra}\n`);
    process.exit(2);
  }
  // Before anything creates a tracer, meter or fastify app.
  let telemetry: TelemetryHandle;
  try {
    telemetry = await startTelemetry({
      serviceName: `gym-ckpt-${name}`,
      serviceInstanceId: config.instance,
      ...(config.otlpEndpoint && { otlpEndpoint: config.otlpEndpoint }),
      ...(config.metricsPort !== undefined && { metricsPort: config.metricsPort }),
    });
  } catch (error) {
    // A metrics port listen() refused (in use, EACCES) is configuration too, exit 2, its code on the
    // line as the coordinator prints it; EADDRINUSE and the port stay there for the Gym launcher.
    if (isListenRefusal(error)) {
      process.stderr.write(`${name}: ${error.code}: ${error.message}\n`);
      process.exit(2);
    }
    // A bad OTEL_* variable is configuration, like a bad flag: one line, exit 2.
    if (error instanceof CheckpointError && error.code === "invalid_request") {
      process.stderr.write(`${name}: invalid configuration: ${error.message}\n`);
      process.exit(2);
    }
    // Anything else is one line too, exit 1.
    const refusal = toCheckpointError(error);
    process.stderr.write(`${name}: ${refusal.code}: metrics endpoint: ${refusal.message}\n`);
    process.exit(1);
  }
  // Data-plane trace context only matters when spans are recorded somewhere.
  const stopHttpPropagation = telemetry.tracing ? propagateHttpTraceContext() : () => undefined;
  // stdout that refuses a write (a full disk) ends the logs, not the server (protocol/stdout-log-refusal.ts).
  const logger = pino(
    {
      name,
      base: { instance: config.instance },
      redact: { paths: [...LOG_REDACT_PATHS], censor: LOG_REDACT_CENSOR },
      serializers: { err: (err: unknown) => loggedError(err, pino.stdSerializers.err) },
      // Log correlation: the active span's ids, as OTel's pino instrumentation names them.
      mixin: traceLogFields,
    },
    endLogsWhenStdoutRefuses(pino.destination({ dest: process.stdout.fd || 1 }), `${name}: `),
  );
  let nc: NatsConnection;
  const connectOptions = participantConnectOptions(config.nats, `${name}:${config.instance}`);
  try {
    const failure = { unreachable: "unreachable", consequence: "this participant cannot start until NATS is reachable (a supervisor restarts it)" } as const;
    nc = await connectNatsWithin(connectOptions, config.natsConnectWaitMs, failure, logger);
  } catch (error) {
    // A supervisor restarts us; it needs one readable line with its code, not a stack trace
    // (credentials redacted). Refused credentials or servers nats.js cannot parse are
    // configuration, which a restart cannot fix: exit 2, as for a bad flag.
    const refusal = toCheckpointError(error);
    process.stderr.write(`${name}: ${refusal.code}: ${refusal.message}\n`);
    await telemetry.shutdown();
    process.exit(refusal.code === "unauthorized" || refusal.code === "invalid_request" ? 2 : 1);
  }
  const shutdown: (() => Promise<void> | void)[] = [];
  const atStop: (() => void)[] = [];
  let stopping = false;
  // Its NATS dropping and coming back, in one line each (phase messages and heartbeats fail meanwhile).
  void logNatsStatus(nc.status(), logger, () => stopping);
  /** The same clean shutdown for a signal (exit 0) and for losing the participant's name (exit 1). */
  const stop = async (why: { signal: string } | { code: string }, exitCode: number) => {
    if (stopping) return;
    stopping = true;
    logger.info(why, "shutting down");
    for (const fn of atStop) {
      try {
        fn();
      } catch (err) {
        logger.warn({ err }, "shutdown step failed");
      }
    }
    for (const fn of shutdown.reverse()) await Promise.resolve(fn()).catch((err: unknown) => logger.warn({ err }, "shutdown step failed"));
    await drainWithin(nc);
    stopHttpPropagation();
    await telemetry.shutdown();
    if ("signal" in why && why.signal === "SIGHUP") return dieByHangup();
    process.exit(exitCode);
  };
  // `on`, not `once`: a group signal can arrive twice (the terminal, and the `gym-ckpt` wrapper forwarding it).
  process.on("SIGTERM", () => void stop({ signal: "SIGTERM" }, 0));
  process.on("SIGINT", () => void stop({ signal: "SIGINT" }, 0));
  // Its terminal closed (the hangup reaches the whole group): the same clean stop, not Node's default death.
  process.on("SIGHUP", () => void stop({ signal: "SIGHUP" }, 0));
  if (process.env[STOP_WITH_LAUNCHER_ENV] === "1") {
    delete process.env[STOP_WITH_LAUNCHER_ENV]; // for this process only, not for what it starts
    // Started by the Gym launcher: stdin is a pipe the launcher never writes to, and the kernel
    // closes it however the launcher ends, SIGKILL included. Stopping on its EOF as on SIGTERM means
    // no orphan keeps the port and the participant's name (its restart would be instance_conflict).
    const launcherGone = () => void stop({ signal: "launcher_gone" }, 0);
    process.stdin.once("end", launcherGone);
    process.stdin.once("error", launcherGone);
    process.stdin.resume();
    process.stdin.unref(); // watching is no reason to stay alive
  }
  const runtime: ServerRuntime = {
    config,
    extra,
    nc,
    logger,
    telemetry,
    announceReady(url) {
      const metrics = telemetry.metricsUrl ? { metrics_url: telemetry.metricsUrl } : {};
      // The start line: which build serves which deployment, where (the NATS server as connected,
      // host:port, never the configured URL and its credentials).
      logger.info({ version: PACKAGE_VERSION, deployment: config.deployment, url, nats: nc.getServer(), ...metrics }, "started");
      process.stdout.write(`${JSON.stringify({ ready: true, name, instance: config.instance, url, ...metrics })}\n`);
    },
    onShutdown(fn) {
      shutdown.push(fn);
    },
    onStopping(fn) {
      atStop.push(fn);
    },
    async listening(listen) {
      try {
        return await listen;
      } catch (error) {
        const refusal = toCheckpointError(error);
        process.stderr.write(`${name}: ${refusal.code}: ${refusal.message}\n`);
        await nc.close().catch(() => undefined);
        stopHttpPropagation();
        await telemetry.shutdown();
        process.exit(1);
      }
    },
    async serve(app, adapter) {
      const url = await runtime.listening(app.listen({ host: "127.0.0.1", port: config.port }));
      // Registered before the participant starts, so a start that fails (instance_conflict) drains
      // the calls admitted meanwhile too. Shutdown steps run last-registered first: the participant
      // (participate's own step) stops before this one, since with no more control messages
      // nothing would reopen admission or expire a lease, and requests parked for a checkpoint
      // would hold app.close() forever. Then: stop accepting, a bounded drain, close what is left.
      runtime.onShutdown(() => closeWithDrain(app, logger));
      await runtime.participate(adapter);
      runtime.announceReady(url);
      return url;
    },
    async participate<R extends RecordBase>(adapter: ParticipantKind<R>) {
      // Stopping already: the signal's shutdown exits; nothing to start, no ready line.
      if (stopping) return never();
      const starting = startParticipant({
        nc,
        deployment: config.deployment,
        instance: config.instance,
        token: config.token,
        adapter,
        logger,
        ...(config.checkpointRoot && { checkpointRoot: config.checkpointRoot }),
        ...(config.leaseGraceSeconds !== undefined && { leaseGraceSeconds: config.leaseGraceSeconds }),
      });
      // A SIGTERM while it starts waits for the start, then stops what it started (its membership
      // entry removed), before NATS is drained: draining under a starting participant failed it
      // (`internal_error: connection draining`, exit 1) or left its entry announced until the TTL.
      runtime.onShutdown(async () => {
        await (await starting.catch(() => undefined))?.stop();
      });
      let participant: ParticipantHandle<R>;
      try {
        participant = await starting;
      } catch (error) {
        if (stopping) return never();
        const refusal = toCheckpointError(error);
        process.stderr.write(`${name}: ${refusal.code}: ${refusal.message}\n`);
        // The stop steps, as for a signal: calls the HTTP side admitted while the start ran get
        // their drain, NATS is drained, telemetry flushed; then exit 1.
        await stop({ code: refusal.code }, 1);
        return never();
      }
      if (stopping) return never();
      // It no longer answers for its name; serving the HTTP side on would only split the work.
      void participant.lost.then((conflict) => {
        process.stderr.write(`${name}: ${conflict.code}: ${conflict.message}\n`);
        return stop({ code: conflict.code }, 1);
      });
      return participant;
    },
  };
  return runtime;
}
