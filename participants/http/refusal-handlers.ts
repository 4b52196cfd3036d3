import type { Duplex } from "node:stream";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import type { Logger } from "pino";
import { CheckpointError, refuseMalformedHttpRequest, refuseUnknownExpectations, type Kind } from "../../protocol/index.js";
import { refusalCounter, sendRefusal } from "./http-refusal.js";

/**
 * The Fastify options every participant server is created with, for what is answered before any
 * route or hook: a request Node's parser refuses (`Content-Length: abc`, headers past its limit) gets
 * the catalog refusal on the raw socket instead of Fastify's own body, and so does one whose path the
 * router cannot decode; one without Host is served (Node's bare 400 otherwise; nothing here reads
 * Host). Counted under `kind`, as `sendRefusal` counts.
 */
export function participantServerOptions(kind: Kind | null) {
  return {
    clientErrorHandler: (error: Error & { code?: string }, socket: Duplex) => refuseMalformedHttpRequest(error, socket, refusalCounter(kind)),
    // The router's own refusals (a path that does not decode, `/%ff`), before any hook runs.
    frameworkErrors: (error: Error, _request: FastifyRequest, reply: FastifyReply) => void sendRefusal(reply, new CheckpointError("invalid_request", error.message), kind),
    http: { requireHostHeader: false },
  };
}

/**
 * Every failure a participant's HTTP server answers carries a catalog code: refusals as thrown,
 * Fastify's own 4xx (bad JSON, a body over the limit) as `invalid_request`/`payload_too_large`,
 * unknown routes as `not_found`, an unknown `Expect` as `invalid_request`, and anything else as a
 * logged `internal_error`. Each counts under the participant `kind` the server is (null: no
 * participant), as `sendRefusal` says.
 */
export function installRefusalHandlers(app: FastifyInstance, server: string, kind: Kind | null, logger?: Logger): void {
  // An Expect other than 100-continue: the catalog refusal, not Node's bare 417.
  refuseUnknownExpectations(app.server, refusalCounter(kind));
  app.setErrorHandler((error, _request, reply) => {
    if (error instanceof CheckpointError) return sendRefusal(reply, error, kind);
    const status = (error as { statusCode?: number }).statusCode ?? 500;
    const message = error instanceof Error ? error.message : String(error);
    if (status === 413) return sendRefusal(reply, new CheckpointError("payload_too_large", message), kind);
    if (status >= 400 && status < 500) return sendRefusal(reply, new CheckpointError("invalid_request", message), kind);
    logger?.error({ err: error }, `${server} route failed`);
    return sendRefusal(reply, new CheckpointError("internal_error", `the ${server} failed`), kind);
  });
  app.setNotFoundHandler((request, reply) => sendRefusal(reply, new CheckpointError("not_found", `no route ${request.method} ${request.url.split("?")[0]}`), kind));
}
