import { Option, type Command } from "commander";
import { BearerTokenSchema, CheckpointError, connectNats, DeploymentSchema, EpisodeIdSchema, describeZodError, duplicateJsonKey, envSetting, isHttpUrl, redactUrl, MAX_CONTROL_MESSAGE_BYTES, MAX_DEADLINE_AHEAD_S, NATS_INBOX_PREFIXES, natsSettings, parseCaptureKey, toCheckpointError, unsafeJsonInteger, type EpisodeId, type ErrorCode } from "../../protocol/index.js";
import { accessSync, constants, statSync } from "node:fs";
import { CONTROLLER_CONNECT_FAILURE, NatsControllerClient } from "../client/nats-controller-client.js";
import type { NatsConnection } from "@nats-io/transport-node";
import { CheckedClient } from "./checked-client.js";
import type { ControllerClient } from "../client/controller-client.js";
import { readRegularFileSync } from "../publication/regular-file.js";

export interface ClientFlags {
  natsUrl?: string;
  deployment?: string;
  token?: string;
  httpUrl?: string;
  leaderWaitMs?: string;
  json?: boolean;
  /** The op's `--timeout-s`, where it has one: checked before connecting, turned into deadline_ts by `deadlineFrom`. */
  timeoutS?: string;
}

/**
 * Connection flags shared by every client command (env fallbacks: GYM_CKPT_*). A command with no
 * reply to print (`printsReply: false`) keeps `--json` out of its help; it still parses it, to
 * refuse it by name rather than as an unknown option.
 */
export function withClientOptions(command: Command, options: { printsReply?: boolean } = {}): Command {
  const json = new Option("--json", "print the raw JSON reply");
  if (options.printsReply === false) json.hideHelp();
  return command
    .option("--nats-url <url>", "NATS server(s), comma-separated (env GYM_CKPT_NATS_URL)")
    .option("--deployment <name>", "deployment name (env GYM_CKPT_DEPLOYMENT)")
    .option("--token <token>", "controller token (env GYM_CKPT_CONTROLLER_TOKEN or GYM_CKPT_TOKEN)")
    .option("--http-url <url>", "use the HTTP API at this URL instead of NATS (env GYM_CKPT_HTTP_URL)")
    .option("--leader-wait-ms <ms>", "retry this long while no coordinator is the ready leader", "10000")
    .addOption(json);
}

/**
 * Runs `fn` with a client (connected at its first request that passes its schema, `checked-client.ts`); refusals print `error <code>: <detail>` and exit 1. `input`
 * reads what the command takes from the command line (an `--episodes @file`, `--state-json`) before
 * anything is connected, so a bad one is reported as itself, not after a connection error.
 */
export async function withClient(flags: ClientFlags, fn: (client: ControllerClient) => Promise<unknown>): Promise<void>;
export async function withClient<I>(flags: ClientFlags, input: () => I, fn: (client: ControllerClient, input: I) => Promise<unknown>): Promise<void>;
export async function withClient<I>(
  flags: ClientFlags,
  inputOrFn: (() => I) | ((client: ControllerClient) => Promise<unknown>),
  withInput?: (client: ControllerClient, input: I) => Promise<unknown>,
): Promise<void> {
  const env = process.env;
  await runCli(async () => {
    const leaderWaitMs = integerFlag("leader-wait-ms", flags.leaderWaitMs ?? "10000", 0);
    if (flags.timeoutS !== undefined) secondsFlag("timeout-s", flags.timeoutS);
    const deployment = clientDeployment(flags.deployment, env);
    const token = clientToken(flags.token, env);
    if (!token) throw new CheckpointError("unauthorized", "no controller token: pass --token or set GYM_CKPT_CONTROLLER_TOKEN (or GYM_CKPT_TOKEN, the deployment's shared token)");
    const httpUrl = controllerHttpUrl(flags, env);
    let fn = inputOrFn as (client: ControllerClient) => Promise<unknown>;
    if (withInput) {
      const input = (inputOrFn as () => I)();
      fn = (client) => withInput(client, input);
    }
    if (httpUrl !== undefined) {
      // --leader-wait-ms holds over HTTP too (nothing listening, or not_leader), as for collect.
      // Loaded only here: its HTTP stack (undici) is a fifth of what a NATS command would parse at start-up.
      await fn(new CheckedClient(async () => new (await import("../client/http-controller-client.js")).HttpControllerClient({ baseUrl: httpUrl, token, leaderWaitMs })));
      return;
    }
    let nc: NatsConnection | undefined;
    const client = new CheckedClient(async () => {
      nc = await connectNats({ ...natsSettings(flags.natsUrl), inboxPrefix: NATS_INBOX_PREFIXES.controller }, CONTROLLER_CONNECT_FAILURE);
      return new NatsControllerClient({ nc, deployment, token, leaderWaitMs });
    });
    try {
      await fn(client);
    } finally {
      await nc?.close();
    }
  });
}

/**
 * The HTTP API to use instead of NATS: --http-url, else GYM_CKPT_HTTP_URL unless --nats-url is
 * given (a flag beats the environment: an env file's HTTP URL must not send a command given
 * another deployment's NATS elsewhere). An empty --http-url is refused, not taken for "use NATS"
 * (an empty GYM_CKPT_HTTP_URL is unset).
 */
export function controllerHttpUrl(flags: Pick<ClientFlags, "httpUrl" | "natsUrl">, env: NodeJS.ProcessEnv): string | undefined {
  const httpUrl = flags.httpUrl ?? (flags.natsUrl === undefined ? envSetting("GYM_CKPT_HTTP_URL", env) : undefined);
  return httpUrl === undefined ? undefined : httpUrlFlag("http-url", httpUrl);
}

/**
 * The controller token: --token, else GYM_CKPT_CONTROLLER_TOKEN, else GYM_CKPT_TOKEN; empty variables are unset, as for the daemon.
 * One the daemon could never hold (not visible ASCII, as `controller_token` must be: a `\r` left by
 * a token file with CRLF endings, a space) is `invalid_request` before anything is sent, never echoed:
 * nats.js refused it as an internal_error, fetch sent it trimmed, or failed it as outcome_unknown.
 */
export function clientToken(flag: string | undefined, env: NodeJS.ProcessEnv): string | undefined {
  // A flag given empty is that value (docs/api.md), which no controller_token can be: bad usage, not "no token".
  if (flag === "") throw new CheckpointError("invalid_request", "--token is empty (an unset variable?): pass the controller token, or leave the flag out to use GYM_CKPT_CONTROLLER_TOKEN");
  const token = flag ?? (env.GYM_CKPT_CONTROLLER_TOKEN || env.GYM_CKPT_TOKEN || undefined);
  if (token && !BearerTokenSchema.safeParse(token).success) {
    const source = flag !== undefined ? "--token" : env.GYM_CKPT_CONTROLLER_TOKEN ? "GYM_CKPT_CONTROLLER_TOKEN" : "GYM_CKPT_TOKEN";
    throw new CheckpointError("invalid_request", `the controller token (${source}) must be visible ASCII: no whitespace, control or non-ASCII characters (a \\r from a file with CRLF line endings?)`);
  }
  return token;
}

/** The deployment (--deployment, else GYM_CKPT_DEPLOYMENT, else `default`), refused as the daemon refuses it: it is one subject token. */
export function clientDeployment(flag: string | undefined, env: NodeJS.ProcessEnv): string {
  const parsed = DeploymentSchema.safeParse(flag ?? (env.GYM_CKPT_DEPLOYMENT || "default"));
  if (!parsed.success) throw new CheckpointError("invalid_request", `--deployment: ${describeZodError(parsed.error)}`);
  return parsed.data;
}

/** A flag's value as a decimal integer (no hex, exponent, fraction or empty string), or undefined. */
export function decimalInteger(value: string): number | undefined {
  const n = Number(value);
  return /^-?\d+$/.test(value.trim()) && Number.isSafeInteger(n) ? n : undefined;
}

/**
 * A decimal integer flag within [min, max]; anything else (a fraction, a word, an empty value, and
 * what `Number` would also take: `0x10`, `1e3`) is `invalid_request` naming the flag, before
 * anything is created or connected.
 */
export function integerFlag(name: string, value: string, min: number, max?: number): number {
  const n = decimalInteger(value);
  if (n === undefined || n < min || (max !== undefined && n > max)) {
    const range = max === undefined ? (min === 1 ? "a positive integer" : `an integer ≥ ${min}`) : `an integer from ${min} to ${max}`;
    throw new CheckpointError("invalid_request", `--${name} must be ${range}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/**
 * A duration flag in seconds: positive and at most the 7-day deadline cap. Longer ones are usually
 * milliseconds typed as seconds, and past ~24.8 days a timer overflows and fires every millisecond.
 */
export function secondsFlag(name: string, value: string): number {
  const n = Number(value);
  // Decimal only, as integer flags and config numbers: Number() would also take `0x10`, `1e3` or `Infinity`.
  if (!/^\d+(\.\d+)?$/.test(value.trim()) || !(n > 0) || n > MAX_DEADLINE_AHEAD_S) {
    throw new CheckpointError("invalid_request", `--${name} must be a positive number of seconds up to ${MAX_DEADLINE_AHEAD_S} (7 days), got ${JSON.stringify(value)}`);
  }
  return n;
}

/** A URL flag: absolute http(s). */
export function httpUrlFlag(name: string, value: string): string {
  // Shown redacted: `user:pass@host:8480` without its scheme parses as scheme `user:`, and lands here.
  if (!isHttpUrl(value)) throw new CheckpointError("invalid_request", `--${name} must be an http or https URL, got ${JSON.stringify(redactUrl(value))}`);
  return value;
}

/** `--metrics-port`: a TCP port, 0 = any free one. */
export function metricsPortFlag(value: string | undefined): { metricsPort?: number } {
  return value === undefined ? {} : { metricsPort: integerFlag("metrics-port", value, 0, 65535) };
}

/**
 * Exit codes: 0 ok, 1 a refusal (code printed), 2 bad usage or configuration: `invalid_request`,
 * and the codes a command counts as configuration errors too (`configCodes`).
 */
export async function runCli(fn: () => Promise<void>, configCodes: readonly ErrorCode[] = []): Promise<void> {
  try {
    await fn();
  } catch (error) {
    // A file call the storage refused (a full disk under collect's --out) is storage_error, not internal_error.
    const refusal = toCheckpointError(error);
    process.stderr.write(`error ${refusal.code}: ${refusal.message}\n`);
    process.exitCode = refusal.code === "invalid_request" || configCodes.includes(refusal.code) ? 2 : 1;
  }
}

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/**
 * An `--episodes @file` larger than this is refused unread. Its list goes into one control message
 * (at most MAX_CONTROL_MESSAGE_BYTES, compact JSON): four times that leaves room for a pretty-printed
 * file whose list would still fit.
 */
export const MAX_EPISODES_FILE_BYTES = 4 * MAX_CONTROL_MESSAGE_BYTES;

/** Episodes from `r1,r2-a1` (capture keys) or `@file.json` (a JSON array of EpisodeIds or capture keys). */
export function parseEpisodes(value: string): EpisodeId[] {
  let items: unknown[];
  if (value === "@") throw new CheckpointError("invalid_request", "--episodes @ names no file (write @<path to a JSON array>)");
  if (value.startsWith("@")) {
    let parsed: unknown;
    try {
      // Only a regular file within the limit: a FIFO would block the command until a writer came
      // (opened non-blocking, it answers at once), a device such as /dev/zero would be read until
      // memory ran out. Symbolic links are followed.
      const text = readRegularFileSync(value.slice(1), { maxBytes: MAX_EPISODES_FILE_BYTES }).text;
      parsed = JSON.parse(text);
      // JSON.parse keeps the last of a key named twice; the coordinator refuses such a body (docs/api.md).
      const twice = duplicateJsonKey(text);
      if (twice !== undefined) throw new CheckpointError("invalid_request", `${value.slice(1)} names key ${JSON.stringify(twice)} twice in one object`);
    } catch (error) {
      if (error instanceof CheckpointError) throw new CheckpointError("invalid_request", `episodes file ${error.message}`);
      const why = (error as NodeJS.ErrnoException).code === "ENOENT" ? "does not exist" : "is not readable JSON";
      throw new CheckpointError("invalid_request", `episodes file ${value.slice(1)} ${why}`);
    }
    if (!Array.isArray(parsed)) throw new CheckpointError("invalid_request", `${value.slice(1)} must hold a JSON array`);
    items = parsed;
  } else {
    items = value.split(",").map((s) => s.trim()).filter(Boolean);
  }
  return items.map((item) => {
    const episode = typeof item === "string" ? parseCaptureKey(item) : EpisodeIdSchema.safeParse(item).data;
    if (!episode) throw new CheckpointError("invalid_request", `not an episode id or capture key: ${JSON.stringify(item)}`);
    return episode;
  });
}

export function deadlineFrom(timeoutS: string | undefined): number | undefined {
  if (timeoutS === undefined) return undefined;
  return Date.now() / 1000 + secondsFlag("timeout-s", timeoutS);
}

export function controllerStateFrom(flags: { stateJson?: string; stateFile?: string }) {
  if (flags.stateJson !== undefined && flags.stateFile !== undefined) throw new CheckpointError("invalid_request", "use --state-json or --state-file, not both");
  if (flags.stateJson !== undefined) {
    let inline: unknown;
    try {
      inline = JSON.parse(flags.stateJson);
    } catch {
      throw new CheckpointError("invalid_request", "--state-json is not valid JSON");
    }
    // JSON.parse keeps the last of a key named twice: refused, as the coordinator refuses such a body (docs/api.md).
    const twice = duplicateJsonKey(flags.stateJson);
    if (twice !== undefined) throw new CheckpointError("invalid_request", `--state-json names key ${JSON.stringify(twice)} twice in one object`);
    // JSON.parse would round it, as the coordinator refuses such a body.
    const unsafe = unsafeJsonInteger(flags.stateJson);
    if (unsafe !== undefined) throw new CheckpointError("invalid_request", `--state-json holds integer ${unsafe}, past what a double holds exactly: it would be stored as ${Number(unsafe)}; write it as a string`);
    return { inline };
  }
  if (flags.stateFile !== undefined) return { file: flags.stateFile };
  return null;
}

/**
 * The checkpoint root `ls` and `verify` read: `not_found` when it does not exist, so a mistyped
 * --root is not an empty listing; `invalid_request` when this account cannot reach what is in it
 * (search permission; `list`: also read, for `ls`), so that verify's exit 1 keeps meaning "this
 * checkpoint is damaged or unreadable", not "wrong account".
 */
export function rootFrom(root: string | undefined, needs: "enter" | "list" = "enter"): string {
  // An empty --root is its value (an unset "$ROOT"), refused as such: not a fall-back to the variable.
  if (root === "") throw new CheckpointError("invalid_request", "--root names no directory (an empty path)");
  const value = root ?? envSetting("GYM_CKPT_CHECKPOINT_ROOT");
  if (!value) throw new CheckpointError("invalid_request", "no checkpoint root: pass --root or set GYM_CKPT_CHECKPOINT_ROOT");
  let isDirectory: boolean;
  try {
    isDirectory = statSync(value).isDirectory();
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // ENOTDIR: a path below a regular file, which cannot hold a root either.
    if (code === "ENOENT" || code === "ENOTDIR") throw new CheckpointError("not_found", `no checkpoint root at ${value}`);
    if (code === "EACCES" || code === "EPERM") throw new CheckpointError("invalid_request", `checkpoint root ${value} is not accessible to this account (${code})`);
    // A loop of symbolic links on the way is no directory either: bad usage, as the daemon refuses
    // such a checkpoint_root, not internal_error.
    if (code === "ELOOP") throw new CheckpointError("invalid_request", `checkpoint root ${value} is not a directory (${(error as Error).message})`);
    throw error;
  }
  if (!isDirectory) throw new CheckpointError("invalid_request", `checkpoint root ${value} is not a directory`);
  try {
    accessSync(value, needs === "list" ? constants.R_OK | constants.X_OK : constants.X_OK);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EACCES" || code === "EPERM") throw new CheckpointError("invalid_request", `checkpoint root ${value} is not accessible to this account (${code})`);
    throw error;
  }
  return value;
}
