import { envSetting } from "./env-setting.js";
import { CheckpointError } from "./errors.js";

/** Where a process looks for NATS when neither a flag nor GYM_CKPT_NATS_URL names a server. */
export const DEFAULT_NATS_URL = "nats://127.0.0.1:4222";

/** What every gym-ckpt process passes to `connect`: the servers and, when set, its credentials. */
export interface NatsConnectionSettings {
  servers: string[];
  user?: string;
  pass?: string;
  token?: string;
  /** GYM_CKPT_NATS_CONNECT_TIMEOUT_MS when set; else nats.js's own first-connect timeout (20 s). */
  timeout?: number;
}

/** A comma-separated list of server URLs (`invalid_request` when it names none). */
export function natsServers(value: string): string[] {
  const servers = value
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s !== "");
  if (servers.length === 0) throw new CheckpointError("invalid_request", `no NATS server URL in ${JSON.stringify(value)}`);
  return servers;
}

/**
 * How every long-running gym-ckpt process notices a connection that went silent (a server host
 * powered off, a partition: no RST, so TCP keeps "sending" for many minutes): a ping every 10 s, and
 * the connection given up after 3 unanswered, then reconnected (to another server of a cluster).
 * nats.js's defaults (2 min, 2 unanswered) would leave a participant cut off for about 4 minutes,
 * its membership entry expired after 15 s, and a collector's ops timing out all that while.
 */
export const NATS_PING_OPTIONS = { pingInterval: 10_000, maxPingOut: 3 } as const;

/**
 * Each role's reply subjects, its connections' `inboxPrefix`: nats.js's requests, the coordinator
 * engine's shared reply subscription and the KV watch's deliveries all take it, so a role's NATS
 * user may subscribe to `<prefix>.>` alone (deploy/nats/nats-server.production.conf). With one
 * `_INBOX.>` for everybody, a Gym server's credentials could read every reply the coordinator
 * (participants' status) or a controller (the controller API) receives. The coordinator daemon
 * connects as `coordinator`; the CLI and `collect` as `controller`; Gym servers, verifiers and the
 * attach proxy as `gym`. One token each (no dot), so an operator writes the permissions from them.
 */
export const NATS_INBOX_PREFIXES = {
  coordinator: "_INBOX_gym_ckpt_coordinator",
  gym: "_INBOX_gym_ckpt_gym",
  controller: "_INBOX_gym_ckpt_controller",
} as const;
export type NatsRole = keyof typeof NATS_INBOX_PREFIXES;

/**
 * The replies to the coordinator's participant ops (and their presence probes): the engine's shared
 * reply subscription takes this prefix, not the connection's, so the `gym` user may publish to
 * `<prefix>.>` (its answers) without `allow_responses` and without reaching the coordinator's own
 * inbox (its JetStream calls: a forged acknowledgement of a lease or journal write). With
 * `allow_responses`, a `gym` user receiving its own request on a status subject (it may publish and
 * subscribe there) was free to "answer" any subject it named as the reply: the leader lease, the
 * journal, a stream's deletion, another participant's phase subject.
 */
export const NATS_OP_REPLY_PREFIX = "_INBOX_gym_ckpt_coordinator_ops";

/** nats.js's first-connect timeout, the default of GYM_CKPT_NATS_CONNECT_TIMEOUT_MS. */
export const DEFAULT_NATS_CONNECT_TIMEOUT_MS = 20_000;
/** The largest GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: a connect waiting longer is a hang, not a slow server. */
export const MAX_NATS_CONNECT_TIMEOUT_MS = 600_000;

/**
 * How long one first connect waits for a server to answer (its INFO, then the handshake), from
 * GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: a whole number of ms from 1 to 600000; unset (or empty),
 * nats.js's own 20 s. A port that accepts but never speaks NATS is only noticed when it ends.
 */
export function natsConnectTimeoutMs(env: Record<string, string | undefined> = process.env): number | undefined {
  const value = envSetting("GYM_CKPT_NATS_CONNECT_TIMEOUT_MS", env);
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > MAX_NATS_CONNECT_TIMEOUT_MS) {
    throw new CheckpointError("invalid_request", `GYM_CKPT_NATS_CONNECT_TIMEOUT_MS must be a whole number of milliseconds from 1 to ${MAX_NATS_CONNECT_TIMEOUT_MS}, got ${JSON.stringify(value)}`);
  }
  return Number(value);
}

/**
 * The servers (`servers`, else GYM_CKPT_NATS_URL, else the default) and the credentials in
 * GYM_CKPT_NATS_USER / GYM_CKPT_NATS_PASS / GYM_CKPT_NATS_TOKEN: the variables the coordinator's
 * config reads, so participants, the CLI and the collector authenticate the same way; and the first
 * connect's timeout (`natsConnectTimeoutMs`), as the coordinator's `nats.connect_timeout_ms`. They are
 * connection options because nats.js does not take credentials from a `user:pass@` URL.
 */
export function natsSettings(servers: string | undefined, env: Record<string, string | undefined> = process.env): NatsConnectionSettings {
  const timeout = natsConnectTimeoutMs(env);
  return {
    servers: natsServers(servers ?? envSetting("GYM_CKPT_NATS_URL", env) ?? DEFAULT_NATS_URL),
    ...(timeout !== undefined && { timeout }),
    ...(env.GYM_CKPT_NATS_USER && { user: env.GYM_CKPT_NATS_USER }),
    ...(env.GYM_CKPT_NATS_PASS && { pass: env.GYM_CKPT_NATS_PASS }),
    ...(env.GYM_CKPT_NATS_TOKEN && { token: env.GYM_CKPT_NATS_TOKEN }),
  };
}

/**
 * Credentials can also ride in the server URLs (`nats://user:pass@host`, or `user:pass@host` with no
 * scheme, in any entry of the comma-separated list), though nats.js takes none from there. A
 * credential may hold any character: `@`, `/`, `,` (which splits its URL into entries of the list)
 * and even `,nats://`. So where one starts and which `@` ends it cannot be told from the text:
 * `nats://u:p@h1,nats://u2:p2@h2` may be two servers, or one whose password is `p@h1,nats://u2:p2`.
 * Everything before the last `@` may be a credential, and goes (a comma-separated list included:
 * redacting less printed the part of a password between an `@` and a `,`). Kept: a known scheme
 * opening the string (read as the scheme by every URL parser, never as a user), and from the last
 * `@` on, where no credential can be (it ends at an `@`): that host and the servers after it.
 *
 * A query or fragment goes too, with everything after it: nats.js parses each entry with `new URL`
 * and ignores `/?token=…` or `#…` without a word, so an operator may well have put a token there
 * (as other clients take one), and a comma may be part of it (`?token=a,b`: the entries after it may
 * be its rest). A `?` or `#` before the last `@` cannot be told from the text either: a password
 * holding it, or a query holding an `@` (`?user=a@b&token=…`) that runs on past it; then nothing but
 * the scheme is kept. A list without `@`, `?` or `#` carries no credentials and is returned as it is.
 * HTTP URLs are shown through this too (`redactUrl`).
 */
export function redactNatsServers(servers: string): string {
  const lastAt = servers.lastIndexOf("@");
  const opening = /^\s*(?:nats|tls|wss?|https?):\/\//i.exec(servers)?.[0] ?? /^\s*/.exec(servers)![0];
  if (lastAt >= 0 && /[?#]/.test(servers.slice(0, lastAt))) return `${opening}[Redacted]`;
  const text = lastAt < 0 ? servers : `${opening}[Redacted]${servers.slice(lastAt)}`;
  const query = text.search(/[?#]/);
  return query < 0 ? text : `${text.slice(0, query + 1)}[Redacted]`;
}

/** What the server's INFO says of its cluster (nats.js `nc.info`). */
export interface NatsServerInfo {
  cluster?: string;
  /** Client URLs of the cluster's servers (itself included), unless the cluster does not advertise them. */
  connect_urls?: string[];
}

/**
 * Replicas of the KV buckets gym-ckpt creates (leader lease, members, decision journal), the same
 * rule in every process: GYM_CKPT_NATS_REPLICAS when set (1 to 5); else 1 on a single server and 3
 * on a cluster. Not the servers it advertises: during a node's outage that count is lower, and a
 * bucket created (or kept) smaller would stop every coordinator at the next loss. A bucket on one
 * node of a cluster would stop them all when that node is lost.
 */
export function kvReplicas(info: NatsServerInfo | undefined, env: Record<string, string | undefined> = process.env): number {
  const configured = env.GYM_CKPT_NATS_REPLICAS?.trim();
  if (configured) {
    if (!/^[1-5]$/.test(configured)) throw new CheckpointError("invalid_request", `GYM_CKPT_NATS_REPLICAS must be a whole number from 1 to 5, got ${JSON.stringify(configured)}`);
    return Number(configured);
  }
  return info?.cluster ? 3 : 1;
}

/**
 * Whether a JetStream write was refused because the key's revision was not the one expected (a
 * compare-and-set lost to another writer: JetStream API code 10071, "wrong last sequence").
 */
export function isWrongRevision(error: unknown): boolean {
  for (let e: unknown = error; e instanceof Error; e = e.cause) {
    if ((e as { code?: unknown }).code === 10071 || /wrong last sequence/i.test(e.message)) return true;
  }
  return false;
}
