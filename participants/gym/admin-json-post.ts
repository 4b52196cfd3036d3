import type { FastifyRequest } from "fastify";
import { CheckpointError } from "../../protocol/index.js";

/**
 * The reference servers' state-changing admin routes (holds, gates, reset) are unauthenticated test
 * controls on 127.0.0.1. They take only a POST whose body is JSON: a web page can make a GET, or a
 * POST with no body or a form body, to 127.0.0.1 without asking (a link, a form, a no-cors fetch),
 * but it sends `content-type: application/json` cross-site only after a CORS preflight these servers
 * never grant. Call it first in the handler, before anything changes.
 */
export function requireJsonPost(request: FastifyRequest): void {
  const type = (request.headers["content-type"] ?? "").split(";")[0]!.trim().toLowerCase();
  if (request.method !== "POST" || type !== "application/json") {
    throw new CheckpointError("invalid_request", `${request.routeOptions.url ?? request.url} takes a POST with content-type application/json`);
  }
}
