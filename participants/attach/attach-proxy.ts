import { Agent as HttpAgent, createServer, request as httpRequest, type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeaders, type Server, type ServerResponse } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import type { Logger } from "pino";
import { z } from "zod";
import { CheckpointError, EpisodeIdSchema, bearerToken, describeZodError, parseRolloutPath, toCheckpointError, tokensEqual } from "../../protocol/index.js";
import type { AdmissionTicket } from "../kinds/model/admission-ticket.js";
import { isGenerationRoute } from "../kinds/model/conversation-digest.js";
import type { ModelKind } from "../kinds/model/model-kind.js";
import type { Upstream } from "./upstream-url.js";
import { UsageTail } from "./usage-tail.js";

/**
 * The attach proxy: a streaming-safe reverse proxy that makes an OpenAI-compatible server we do
 * not own a model participant. `POST /ng-rollout/<capture_key>/v1/{chat/completions,responses,messages}`
 * gets an admission ticket and is forwarded with the `x-ng-*` lineage headers; the response start
 * is intercepted (held while admission is closed), then bytes are piped through with backpressure
 * — a stream is never buffered whole. Other routes pass through untracked.
 *
 * Framework-side ledger API (bearer auth with the control token):
 *   GET    /ng-capture/v1/ledger/<capture_key>   → {capture_key, records}
 *   DELETE /ng-capture/v1/ledger/<capture_key>   (refused while a checkpoint is open)
 *   POST   /ng-capture/v1/ledger/retire {rollout_id, attempt}  retires attempts 0..attempt
 *   GET    /ng-capture/v1/status                 → readiness counts and extras
 */
export interface AttachProxyOptions {
  upstream: Upstream;
  kind: ModelKind;
  controlToken: string;
  logger?: Logger;
  maxBodyBytes?: number;
}

const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"]);
const RetireBodySchema = z.object({ rollout_id: EpisodeIdSchema.shape.rollout_id, attempt: z.number().int().min(0) }).strict();

export function createAttachProxy(options: AttachProxyOptions): Server {
  const { upstream, kind, logger } = options;
  const maxBody = options.maxBodyBytes ?? 32 * 1024 * 1024;
  const secure = upstream.url.protocol === "https:";
  // Keep-alive sockets to the upstream, as many as there are concurrent calls, without Nagle: a
  // request costs no connect once the pool is warm.
  const agentOptions = { keepAlive: true, maxSockets: Infinity, maxFreeSockets: 1024, noDelay: true };
  const agent = secure ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
  const send = secure ? httpsRequest : httpRequest;
  const basePath = upstream.url.pathname.replace(/\/+$/, "");

  const server = createServer({ noDelay: true, keepAlive: true }, (req, res) => {
    handle(req, res).catch((error: unknown) => {
      logger?.warn({ err: error }, "attach proxy request failed");
      if (!res.headersSent) refuse(res, error);
      else res.destroy();
    });
  });
  server.on("close", () => agent.destroy());

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const rawUrl = req.url ?? "/";
    const q = rawUrl.indexOf("?");
    const path = q === -1 ? rawUrl : rawUrl.slice(0, q);
    const query = q === -1 ? "" : rawUrl.slice(q);
    if (path === "/health" && req.method === "GET") return json(res, 200, { ok: true, admission_open: kind.admissionOpen });
    if (path.startsWith("/ng-capture/v1/")) return ledgerApi(req, res, path);
    let rollout: ReturnType<typeof parseRolloutPath>;
    try {
      rollout = parseRolloutPath(path);
    } catch {
      rollout = "invalid";
    }
    if (rollout === "invalid") throw new CheckpointError("invalid_request", "the /ng-rollout/ prefix does not name a valid capture key");
    const route = rollout ? rollout.route : path;
    if (!isGenerationRoute(route) || req.method !== "POST") return passthrough(req, res, route + query, undefined);
    if (!rollout) throw new CheckpointError("rollout_id_required", "generation calls must use the /ng-rollout/<capture_key>/ prefix");
    const body = await readBody(req, maxBody);
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString("utf8"));
    } catch {
      throw new CheckpointError("invalid_request", "the request body is not JSON");
    }
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new CheckpointError("invalid_request", "the request body must be a JSON object");
    const ticket = await kind.admit(rollout.captureKey, route, parsed as Record<string, unknown>, rollout.episode);
    return forward(req, res, route + query, body, ticket);
  }

  function upstreamHeaders(req: IncomingMessage, length: number | undefined): OutgoingHttpHeaders {
    const headers: OutgoingHttpHeaders = {};
    for (const [name, value] of Object.entries(req.headers)) {
      if (value === undefined || HOP_BY_HOP.has(name) || name.startsWith("x-ng-")) continue;
      headers[name] = value;
    }
    headers.host = upstream.url.host;
    if (length !== undefined) headers["content-length"] = length;
    return headers;
  }

  function responseHeaders(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
    const out: OutgoingHttpHeaders = {};
    for (const [name, value] of Object.entries(headers)) {
      if (value === undefined || (HOP_BY_HOP.has(name) && name !== "content-length")) continue;
      out[name] = value;
    }
    return out;
  }

  function passthrough(req: IncomingMessage, res: ServerResponse, route: string, _body: undefined): void {
    const headers = upstreamHeaders(req, undefined);
    if (req.headers["content-length"] !== undefined) headers["content-length"] = req.headers["content-length"];
    else if (req.headers["transfer-encoding"]) headers["transfer-encoding"] = req.headers["transfer-encoding"];
    const up = send({ protocol: upstream.url.protocol, hostname: upstream.url.hostname, port: upstream.url.port, path: basePath + route, method: req.method, headers, agent });
    up.on("response", (upRes) => {
      res.writeHead(upRes.statusCode ?? 502, responseHeaders(upRes.headers));
      upRes.pipe(res);
    });
    up.on("error", (error) => {
      if (!res.headersSent) refuse(res, new CheckpointError("internal_error", `upstream: ${error.message}`), 502);
      else res.destroy();
    });
    res.on("close", () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  }

  function forward(req: IncomingMessage, res: ServerResponse, route: string, body: Buffer, ticket: AdmissionTicket): void {
    const headers = upstreamHeaders(req, body.length);
    headers["x-ng-capture-key"] = ticket.captureKey;
    headers["x-ng-model-call-id"] = ticket.modelCallId;
    if (ticket.parentCallId) headers["x-ng-parent-call-id"] = ticket.parentCallId;
    if (ticket.claimedCut) {
      headers["x-ng-continued-from"] = ticket.claimedCut.model_call_id;
      headers["x-ng-continuation"] = Buffer.from(JSON.stringify(ticket.claimedCut.continuation)).toString("base64url");
    }
    let settled = false;
    const failOnce = () => {
      if (settled) return;
      settled = true;
      kind.fail(ticket);
    };
    const up = send({ protocol: upstream.url.protocol, hostname: upstream.url.hostname, port: upstream.url.port, path: basePath + route, method: "POST", headers, agent });
    const onAbort = () => {
      up.destroy();
      if (!res.headersSent) refuse(res, new CheckpointError("stale_attempt", `${ticket.captureKey} was retired`));
      else res.destroy();
      failOnce();
    };
    ticket.abort.signal.addEventListener("abort", onAbort, { once: true });
    res.on("close", () => {
      ticket.abort.signal.removeEventListener("abort", onAbort);
      if (!res.writableFinished) {
        up.destroy();
        failOnce();
      }
    });
    up.on("error", (error) => {
      if (settled) return;
      if (!res.headersSent) refuse(res, new CheckpointError("internal_error", `upstream: ${error.message}`), 502);
      else res.destroy();
      failOnce();
    });
    up.on("response", (upRes) => {
      // Listening from the start: an upstream that dies while its response is held fails the call
      // (the caller re-issues it), instead of leaving it "streaming" after reopen — a prepare
      // blocker with nothing left to stream.
      let lost = false;
      const onLost = () => {
        if (lost) return;
        lost = true;
        if (ticket.held && !res.headersSent) upstreamLost();
      };
      const upstreamLost = () => {
        if (!res.headersSent && !res.writableEnded) refuse(res, new CheckpointError("internal_error", "upstream: the connection closed before the response completed"), 502);
        failOnce();
      };
      upRes.on("error", onLost);
      upRes.once("close", () => {
        if (!upRes.complete) onLost();
      });
      void (async () => {
        try {
          await kind.responseStart(ticket);
        } catch (error) {
          upRes.destroy();
          if (!res.headersSent && !res.destroyed) refuse(res, error);
          failOnce();
          return;
        }
        if (res.destroyed) {
          upRes.destroy();
          failOnce();
          return;
        }
        if (lost) return upstreamLost();
        const status = upRes.statusCode ?? 502;
        res.writeHead(status, responseHeaders(upRes.headers));
        // One listener copies each chunk through and keeps the usage tail; a full socket pauses the
        // upstream until it drains (backpressure), so a stream is never buffered here.
        const tail = new UsageTail();
        const resume = () => upRes.resume();
        res.on("drain", resume);
        upRes.on("data", (chunk: Buffer) => {
          tail.push(chunk);
          if (!res.write(chunk)) upRes.pause();
        });
        upRes.on("error", () => {
          res.destroy();
          failOnce();
        });
        upRes.on("end", () => {
          if (settled) return void res.end();
          settled = true;
          if (status < 200 || status >= 300) {
            kind.fail(ticket);
            return void res.end();
          }
          const staging = upRes.headers["x-ng-staging-key"];
          // The caller gets its end first; the row is recorded in this same tick, so no next call of
          // this rollout can be admitted before complete() has put it in the in-memory ledger.
          res.end();
          const written = kind.complete(ticket, { stagingKey: typeof staging === "string" && staging ? staging.slice(0, 512) : null, usage: tail.usage() });
          written.catch((error: unknown) => logger?.error({ err: error, capture_key: ticket.captureKey }, "ledger row write failed"));
        });
      })();
    });
    up.end(body);
  }

  async function ledgerApi(req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
    const token = bearerToken(req.headers.authorization);
    if (token === undefined || !tokensEqual(token, options.controlToken)) throw new CheckpointError("unauthorized", "bad or missing bearer token");
    if (path === "/ng-capture/v1/status" && req.method === "GET") return json(res, 200, { ...kind.readiness(), ...kind.statusExtras() });
    if (path === "/ng-capture/v1/ledger/retire" && req.method === "POST") {
      const parsed = RetireBodySchema.safeParse(safeJson((await readBody(req, 64 * 1024)).toString("utf8")));
      if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
      return json(res, 200, { retired: await kind.retireLedgers(parsed.data) });
    }
    const prefix = "/ng-capture/v1/ledger/";
    if (path.startsWith(prefix)) {
      const key = decodeURIComponent(path.slice(prefix.length));
      if (req.method === "GET") return json(res, 200, await kind.captureManifest(key));
      if (req.method === "DELETE") {
        await kind.deleteLedger(key);
        return json(res, 200, { deleted: key });
      }
    }
    throw new CheckpointError("not_found", `no such capture route: ${req.method} ${path}`);
  }

  return server;
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function json(res: ServerResponse, status: number, body: unknown): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(payload) });
  res.end(payload);
}

function refuse(res: ServerResponse, error: unknown, status?: number): void {
  const refusal = toCheckpointError(error);
  json(res, status ?? refusal.status, refusal.toReply());
}

function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        reject(new CheckpointError("invalid_request", `request body larger than ${limit} bytes`));
        req.destroy();
      } else chunks.push(chunk);
    });
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}
