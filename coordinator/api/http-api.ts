import { context, propagation } from "@opentelemetry/api";
import { isIPv6 } from "node:net";
import Fastify, { type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import type { Logger } from "pino";
import {
  CONTROLLER_OP_NAMES,
  CheckpointError,
  HEADER_COORDINATOR_EPOCH,
  HEADER_COORDINATOR_SERVED,
  HEADER_COORDINATOR_ID,
  MAX_CHECKPOINT_ID_CHARS,
  MAX_CONTROL_MESSAGE_BYTES,
  formatCoordinatorIdHeader,
  refuseMalformedHttpRequest,
  refuseUnknownExpectations,
  toCheckpointError,
  type ControllerOp,
} from "../../protocol/index.js";
import { listenRefusal } from "../../protocol/listen-refusal.js";
import type { CheckpointEngine } from "../engine/checkpoint-engine.js";
import type { Leadership } from "../ha/leadership.js";
import { authorizeController } from "./controller-auth.js";
import { dispatchController } from "./controller-dispatch.js";
import { buildOpenApiDocument, httpRoute } from "./openapi.js";
import { StoppingConnections } from "./stopping-connections.js";

export interface HttpControllerApiOptions {
  engine: CheckpointEngine;
  leadership: Leadership;
  token: string;
  host?: string;
  port?: number;
  logger?: Logger;
  /** How long a request's body may take to arrive once its headers are in (default 60 s; at most 1 MiB). */
  bodyWaitMs?: number;
}

/**
 * The HTTP/JSON controller API for controllers that do not speak NATS: one POST per op, GET status,
 * list and one checkpoint, /healthz, /readyz and the generated /openapi.json. Bound to 127.0.0.1 by
 * default. Bodies are decoded by the same strict codec as the NATS API, so refusals are identical.
 */
export class HttpControllerApi {
  private app: FastifyInstance | undefined;
  private address: { host: string; port: number } | undefined;
  /** Each request's wait for its body, cleared once the body is in. */
  private readonly bodyWaits = new WeakMap<FastifyRequest, NodeJS.Timeout>();
  private connections: StoppingConnections | undefined;
  /** Set when the stop begins: a request still arriving then is refused `not_leader` (see stop). */
  private stopping = false;

  constructor(private readonly options: HttpControllerApiOptions) {}

  get url(): string {
    if (!this.address) throw new Error("the HTTP API is not listening");
    return httpUrlOf(this.address.host, this.address.port);
  }

  async start(): Promise<string> {
    const app = Fastify({
      logger: false,
      bodyLimit: MAX_CONTROL_MESSAGE_BYTES + 1024,
      // The only path parameter is a checkpoint id (Fastify's default limit, 100, is shorter).
      routerOptions: { maxParamLength: MAX_CHECKPOINT_ID_CHARS },
      // Router errors (bad percent-encoding, an over-long parameter) and requests Node's HTTP
      // parser rejects (`Content-Length: abc`) get a catalog refusal, not Fastify's own body.
      frameworkErrors: (error, _req, reply) => void this.refuse(reply, new CheckpointError("invalid_request", error.message)),
      // Node's parser refused it before any route saw it: the catalog refusal, not Fastify's own body.
      clientErrorHandler: (error, socket) => refuseMalformedHttpRequest(error, socket),
      // An HTTP/1.1 request without Host would get Node's bare 400 (no body, no code); nothing here
      // reads Host, so such a request is served like any other.
      http: { requireHostHeader: false },
      // Requests arriving while the server closes get our `not_leader` (see stop), not Fastify's own 503 body.
      return503OnClosing: false,
    });
    this.app = app;
    // Written on Node's response, under Fastify, which then runs nothing more for that request.
    this.connections = new StoppingConnections(app.server, (res) => {
      const refusal = stoppingRefusal();
      const body = JSON.stringify(refusal.toReply());
      res.writeHead(refusal.status, { "content-type": "application/json", "content-length": Buffer.byteLength(body), connection: "close" }).end(body);
    });
    refuseUnknownExpectations(app.server);
    // The last answer a connection carries once the stop began closes it, and says so: a client
    // keeping it alive could write its next op on it as the stop closes it, a cut it must read as
    // outcome_unknown. Not one with requests pipelined behind it: their refusals would be dropped.
    app.addHook("onSend", (req, reply, payload, done) => {
      if (this.stopping && !this.connections?.hasRequestBehind(req.raw)) reply.header("connection", "close");
      done(null, payload);
    });
    // Raw bodies: our codec turns malformed JSON, size and schema errors into catalog codes. Bytes,
    // as NATS delivers them: decoded first, invalid UTF-8 (3 bytes per U+FFFD) would count as too large.
    app.removeAllContentTypeParsers();
    app.addContentTypeParser("*", { parseAs: "buffer" }, (_req, body, done) => done(null, body));
    app.setErrorHandler((error: Error & { code?: string; statusCode?: number }, _req, reply) => {
      const refusal =
        error.code === "FST_ERR_CTP_BODY_TOO_LARGE"
          ? new CheckpointError("payload_too_large", `body is larger than ${MAX_CONTROL_MESSAGE_BYTES} bytes`)
          : error.statusCode && error.statusCode < 500 && !(error instanceof CheckpointError)
            ? new CheckpointError("invalid_request", error.message)
            : toCheckpointError(error);
      void this.refuse(reply, refusal);
    });
    app.setNotFoundHandler((req, reply) => void this.refuse(reply, new CheckpointError("not_found", `no route ${req.method} ${req.url.split("?")[0]}`)));

    const openapi = buildOpenApiDocument();
    app.get("/openapi.json", async () => openapi);
    app.get("/healthz", async () => ({ ok: true }));
    app.get("/readyz", async (_req, reply) => {
      const state = this.options.leadership.state();
      // Ready = the engine serves controller ops: leader, past its first lease period, recovered.
      const other = this.options.leadership.leaderOfOtherVersion();
      const why = other === undefined ? "" : `: ${other}`;
      // Both answers name this coordinator, in headers (the bodies are as they were, for clients that
      // read them strictly): behind a load balancer, a client watching an op counts only the refusals
      // of the coordinator that took it, never a standby's.
      reply.header(HEADER_COORDINATOR_ID, formatCoordinatorIdHeader(state.id));
      if (state.epoch !== null) reply.header(HEADER_COORDINATOR_EPOCH, String(state.epoch));
      // A refusal of a term that served (stopping, or its renewal lapsed) may come from the op's own
      // coordinator: a client must not take it for a successor that did not serve yet. This API serves
      // ops as soon as the engine recovered in the term (its gate; leadershipLost shuts it again),
      // before the lease is marked serving (after the NATS API subscribed, or never if that fails or
      // a stop begins first): from then on, too.
      if (state.epoch !== null && (state.serving === true || this.options.engine.recovered)) reply.header(HEADER_COORDINATOR_SERVED, "1");
      if (this.stopping || !state.ready || !this.options.engine.recovered) return this.refuse(reply, new CheckpointError("not_leader", `this coordinator is not the ready leader${why}`));
      return { ok: true, epoch: state.epoch };
    });
    for (const op of CONTROLLER_OP_NAMES) {
      const { method, url } = httpRoute(op);
      const fastifyUrl = url.replace("{checkpoint_id}", ":checkpoint_id");
      app.route({
        method,
        url: fastifyUrl,
        // A HEAD would run the op (status probes every participant) only to drop its body.
        exposeHeadRoute: false,
        // Before the body is read: an unauthenticated client cannot make us buffer 1 MiB.
        onRequest: async (req, reply) => {
          try {
            if (this.stopping) throw stoppingRefusal();
            authorizeController(req.headers.authorization, this.options.token);
          } catch (error) {
            return this.refuse(reply, toCheckpointError(error));
          }
        },
        // A body that stops coming is cut after bodyWaitMs (Fastify sets no request timeout): a
        // client holding the token cannot keep sockets and their partial bodies open for ever.
        // Waited for only until the body is in (preHandler) or the reply is gone, never the op.
        preParsing: (req, reply, payload, done) => {
          const timer = setTimeout(() => refuseMalformedHttpRequest(Object.assign(new Error("the request body did not arrive in time"), { code: "ERR_HTTP_REQUEST_TIMEOUT" }), req.raw.socket), this.options.bodyWaitMs ?? 60_000);
          timer.unref();
          this.bodyWaits.set(req, timer);
          reply.raw.once("close", () => clearTimeout(timer));
          done(null, payload);
        },
        preHandler: (req, _reply, done) => {
          clearTimeout(this.bodyWaits.get(req));
          done();
        },
        handler: (req, reply) => this.handle(op, req, reply),
      });
    }
    const host = this.options.host ?? "127.0.0.1";
    const port = this.options.port ?? 0;
    // A port taken or not allowed is the configuration's (exit 2), as for --metrics-port; Fastify's
    // own error would be internal_error, exit 1, restarted for ever on a port that stays taken.
    await app.listen({ host, port }).catch(async (error: unknown) => {
      await app.close().catch(() => undefined);
      throw listenRefusal(error, "http.port", host, port);
    });
    const info = app.server.address();
    if (!info || typeof info === "string") throw new Error("unexpected listen address");
    this.address = { host: info.address, port: info.port };
    this.options.logger?.info({ url: this.url }, "http_api_listening");
    return this.url;
  }

  private async handle(op: ControllerOp, req: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    try {
      // No op reads a query parameter: one a controller meant as an argument (`?limit=5`) is refused,
      // as an unknown field of a body is, rather than the op run without it.
      if (req.url.includes("?")) throw new CheckpointError("invalid_request", `${req.method} ${req.url.slice(0, req.url.indexOf("?"))} takes no query parameters`);
      let body: unknown;
      if (op === "get") body = { checkpoint_id: (req.params as { checkpoint_id?: string }).checkpoint_id };
      else if (req.method === "GET") body = {};
      else body = req.body instanceof Uint8Array ? req.body : "";
      // The controller's traceparent, as the NATS API reads it: its span parents the op's.
      const parent = propagation.extract(context.active(), req.headers);
      return await context.with(parent, () => dispatchController(this.options.engine, op, body));
    } catch (error) {
      const refusal = toCheckpointError(error);
      if (refusal.code === "internal_error") this.options.logger?.error({ op, err: error }, "controller_op_internal_error");
      return this.refuse(reply, refusal);
    }
  }

  private refuse(reply: FastifyReply, refusal: CheckpointError): FastifyReply {
    return reply.code(refusal.status).header("content-type", "application/json").send(JSON.stringify(refusal.toReply()));
  }

  /**
   * A request that still arrives (pipelined behind an op this stop lets finish), or whose body was
   * still arriving when the stop began, is refused `not_leader`: nothing ran, and a client sends it
   * again, to the successor. Fastify's own 503 body is no catalog refusal: a client would take it
   * for a proxy's and answer `outcome_unknown`.
   */
  async stop(): Promise<void> {
    this.stopping = true;
    this.connections?.stop();
    await this.app?.close();
    this.app = undefined;
  }
}

/** A request this coordinator will not run because it is stopping: nothing ran, send it again (to its successor). */
function stoppingRefusal(): CheckpointError {
  return new CheckpointError("not_leader", "this coordinator is stopping; send the request to its successor");
}

/** The base URL of a listening address: an IPv6 literal in brackets (`http://[::1]:8480`), or no client could parse it. */
export function httpUrlOf(host: string, port: number): string {
  return `http://${isIPv6(host) ? `[${host}]` : host}:${port}`;
}
