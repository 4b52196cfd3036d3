import { tmpdir } from "node:os";
import { BearerTokenSchema, CheckpointError, isMisplacedDirectory, makeDirectories, toCheckpointError } from "../../protocol/index.js";
import { ModelKind } from "../kinds/model/model-kind.js";
import { cutTokenSetting, startServerRuntime, type CommonServerConfig } from "../gym/server-runtime.js";
import { parseListen, parseUpstream } from "./upstream-url.js";
import { DEFAULT_MAX_BODY_BYTES, createAttachProxy } from "./attach-proxy.js";
import { refuseCaseFoldingDir } from "../storage/case-folding-dir.js";
import { ensurePrivateDir } from "./private-dir.js";
import { AttachProxyShutdown } from "./proxy-shutdown.js";

/**
 * `gym-ckpt attach model --upstream <openai-base-url> --listen <host:port>`: the model participant
 * as a reverse proxy in front of an OpenAI-compatible server (vLLM, SGLang, the reference backend).
 *   --upstream URL        the inference server's base URL (`http://host:8000/v1` or `http://host:8000`)
 *   --listen HOST:PORT    where to listen (default 127.0.0.1 and --port)
 *   --cuts on|off         send generation-cut rounds to the upstream (default on; off for servers
 *                         without `/ng-control/v1/generation-cut`)
 *   --cut-token T         bearer token of the cut endpoint (env GYM_CKPT_CUT_TOKEN; default: --token)
 *   --cut-timeout-ms N    deadline of one cut round (default 10000)
 *   --max-body-mib N      largest generation request body read, in MiB (default 32, at most 256;
 *                         a multimodal conversation carries its images in every call)
 *   --ledger-dir DIR      capture ledger directory (default <tmp>/gym-ckpt-ledger-<uid>/<deployment>/<instance>,
 *                         created 0700 and refused unless every level under <tmp> is this user's own)
 * plus the common runtime flags (--nats, --deployment, --instance, --token, --port, ...).
 */
function fail(message: string): never {
  process.stderr.write(`attach model: ${message}\n`);
  process.exit(2);
}

/**
 * The proxy's own flags, checked with the common ones before NATS (read, not checked, below): a
 * bad one is exit 2 also while NATS is down, not `unreachable`, exit 1, which a supervisor restarts.
 */
async function checkFlags(flags: Record<string, string | undefined>, config: CommonServerConfig): Promise<undefined> {
  if (!flags.upstream) fail("--upstream <openai-base-url> is required");
  try {
    parseUpstream(flags.upstream);
    if (flags.listen) parseListen(flags.listen);
  } catch (error) {
    fail(error instanceof Error ? error.message : String(error));
  }
  if (flags.cuts !== undefined && flags.cuts !== "on" && flags.cuts !== "off") fail("--cuts must be on or off");
  const badToken = cutTokenSetting(flags).refusal;
  if (badToken) fail(badToken);
  const cutTimeoutMs = Number(flags["cut-timeout-ms"] ?? "10000");
  if (!Number.isInteger(cutTimeoutMs) || cutTimeoutMs < 1 || cutTimeoutMs > 600_000) fail("--cut-timeout-ms must be an integer in 1..600000");
  if (maxBodyBytes(flags["max-body-mib"]) === undefined) fail(`--max-body-mib must be an integer in 1..${MAX_BODY_MIB_LIMIT}`);
  ledgerDir = await prepareLedgerDir(flags["ledger-dir"], config);
  return undefined;
}

/**
 * The ledger directory, created and checked before NATS too: one that can never serve (a planted
 * default level, an explicit one that cannot be created) is exit 2 also while NATS is down.
 */
async function prepareLedgerDir(explicit: string | undefined, config: CommonServerConfig): Promise<string> {
  let dir: string;
  try {
    // The default lives in the shared temp dir: another local user must not have planted any level of it.
    // Per user: a first user's private directory would otherwise refuse every other user's proxy.
    dir = explicit ?? ensurePrivateDir(tmpdir(), [`gym-ckpt-ledger-${process.getuid?.() ?? "user"}`, config.deployment, config.instance]);
  } catch (error) {
    fail(error instanceof Error ? error.message : String(error));
  }
  if (explicit !== undefined) {
    // Created (0700) here rather than first by the ledger, so one that cannot exist is refused before serving.
    await makeDirectories(dir, { mode: 0o700 }).catch((error: NodeJS.ErrnoException) => {
      if (isMisplacedDirectory(error)) fail(`invalid_request: --ledger-dir ${dir} cannot be created (${error.message})`);
      // Anything else (EIO, a full disk) is still a coded refusal, never a stack trace; exit 1: a restart may help.
      const refusal = toCheckpointError(error);
      process.stderr.write(`attach model: ${refusal.code}: --ledger-dir ${dir}: ${refusal.message}\n`);
      process.exit(1);
    });
  }
  // Probed here too (the ledger does at its open): a case-insensitive filesystem never serves, so exit 2 before NATS.
  await refuseCaseFoldingDir(dir, "capture ledger directory").catch((error: unknown) => {
    const refusal = toCheckpointError(error);
    if (error instanceof CheckpointError) fail(`${refusal.code}: ${refusal.message}`);
    process.stderr.write(`attach model: ${refusal.code}: --ledger-dir ${dir}: ${refusal.message}\n`);
    process.exit(1);
  });
  return dir;
}

/**
 * The most `--max-body-mib` raises the body limit to: the body is decoded as one string and walked
 * for its conversation digest as canonical JSON, both well within the longest string (512 MiB).
 */
const MAX_BODY_MIB_LIMIT = 256;

/** `--max-body-mib` in bytes (default DEFAULT_MAX_BODY_BYTES); undefined when it is no whole number of MiB in range. */
function maxBodyBytes(flag: string | undefined): number | undefined {
  if (flag === undefined) return DEFAULT_MAX_BODY_BYTES;
  const mib = /^[0-9]+$/.test(flag) ? Number(flag) : NaN;
  return Number.isSafeInteger(mib) && mib >= 1 && mib <= MAX_BODY_MIB_LIMIT ? mib * 1024 * 1024 : undefined;
}

/** Set by checkFlags, before NATS. */
let ledgerDir!: string;

const runtime = await startServerRuntime("attach-model", process.argv.slice(2), ["upstream", "listen", "cuts", "cut-token", "cut-timeout-ms", "max-body-mib", "ledger-dir"], checkFlags);
const { config, extra, logger } = runtime;

// Checked with the common flags (checkFlags; the token was, as --cut-token's fallback): read, not refused, here.
const upstream = parseUpstream(extra.upstream!);
const listen = extra.listen ? parseListen(extra.listen) : { host: "127.0.0.1", port: config.port };
const cuts = extra.cuts ?? "on";
const cutToken = BearerTokenSchema.parse(cutTokenSetting(extra).token ?? config.token);
const cutTimeoutMs = Number(extra["cut-timeout-ms"] ?? "10000");
const kind = new ModelKind({
  ledgerDir,
  cutBackend: cuts === "on" ? { root: upstream.root, token: cutToken, timeoutMs: cutTimeoutMs, serverName: config.instance } : null,
  logger,
});
const server = createAttachProxy({ upstream, kind, controlToken: config.token, logger, maxBodyBytes: maxBodyBytes(extra["max-body-mib"])! });
const shutdown = new AttachProxyShutdown(server, kind, logger);
// Both registered before the proxy listens and its participant starts, so a signal at any point of
// start-up closes the proxy and its ledger too: no new call from the signal on, then (steps run
// last registered first) after the participant's stop the drain and the ledger's close, before
// NATS and telemetry close.
runtime.onStopping(() => shutdown.stopAdmitting());
runtime.onShutdown(() => shutdown.close());
await runtime.listening(
  new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(listen.port, listen.host, () => resolve());
  }),
);
const address = server.address();
const port = typeof address === "object" && address ? address.port : listen.port;
const host = listen.host.includes(":") ? `[${listen.host}]` : listen.host;
const url = `http://${host}:${port}`;
const participant = await runtime.participate(kind);
kind.bindCheckpointId(() => participant.controlPlane.activeCheckpointId);
logger.info({ url, upstream: upstream.root, cuts, ledgerDir }, "attach proxy listening");
runtime.announceReady(url);
