import type { FastifyInstance } from "fastify";
import { CheckpointError, MAX_JSON_DEPTH, duplicateJsonKey, jsonNestsDeeperThan } from "../../protocol/index.js";

/**
 * The `application/json` body parser of the participants' Gym servers: refuses (`invalid_request`)
 * what JSON.parse would read without a word, as the control subjects' decoder does: a key named
 * twice in one object (JSON.parse keeps the last, so `"attempt":0,"attempt":1` would run attempt 1),
 * and nesting past MAX_JSON_DEPTH. An empty body is `{}`: callers often POST none (close_session).
 */
export function installJsonBodyParser(app: FastifyInstance): void {
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "string" }, (_request, body, done) => {
    const text = typeof body === "string" ? body : body.toString("utf8");
    if (text.trim() === "") return done(null, {});
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch {
      return done(new CheckpointError("invalid_request", "the body is not valid JSON"), undefined);
    }
    if (jsonNestsDeeperThan(parsed)) return done(new CheckpointError("invalid_request", `the body nests more than ${MAX_JSON_DEPTH} levels deep`), undefined);
    const twice = duplicateJsonKey(text);
    if (twice !== undefined) return done(new CheckpointError("invalid_request", `key ${JSON.stringify(twice)} appears twice in one object of the body`), undefined);
    done(null, parsed);
  });
}
