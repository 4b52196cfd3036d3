import type { FastifyInstance } from "fastify";
import type { Logger } from "pino";
import { CheckpointError, type Kind } from "../../protocol/index.js";
import { sendRefusal } from "./http-refusal.js";

/**
 * Every failure a participant's HTTP server answers carries a catalog code: refusals as thrown,
 * Fastify's own 4xx (bad JSON, a body over the limit) as `invalid_request`/`payload_too_large`,
 * unknown routes as `not_found`, and anything else as a logged `internal_error`. Each counts under
 * the participant `kind` the server is (null: no participant), as `sendRefusal` says.
 */
export function installRefusalHandlers(app: FastifyInstance, server: string, kind: Kind | null, logger?: Logger): void {
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
