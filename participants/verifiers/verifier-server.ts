import type { FastifyInstance, FastifyRequest } from "fastify";
import { z } from "zod";
import { CheckpointError, JsonValueSchema, MAX_JSON_DEPTH, describeZodError, jsonNestsDeeperThan, keepingProtoKey, type JsonValue } from "../../protocol/index.js";
import { ResourcesServer, type CheckpointMode, type CheckpointVerify, type SessionAccess } from "../kinds/resources/index.js";
import { sendVerifierRefusal } from "./verifier-errors.js";

export const VerifierSeedBodySchema = z.object({ task: JsonValueSchema.optional() }).strict();

/**
 * A verifier's task: `shape`'s fields, and any other key a JSON value. An own `__proto__` key, at
 * any depth, is kept as data (keepingProtoKey, JsonValueSchema): `z.object()` and `z.json()` build
 * their output by assignment, which set the copy's prototype instead and dropped the key (the
 * cohort judge was shown the task without it, and two tasks differing there compared equal).
 */
export function verifierTaskSchema<Shape extends z.ZodRawShape>(shape: Shape) {
  return keepingProtoKey(z.object(shape).catchall(JsonValueSchema));
}

/** `/close_session` carries nothing (callers send `{}` or no body). */
export const VerifierCloseBodySchema = z.object({}).strict();

export function parseVerifierBody<T>(schema: z.ZodType<T>, body: unknown): T {
  // The HTTP parser refuses such bodies already; this covers verify() called directly.
  if (jsonNestsDeeperThan(body)) throw new CheckpointError("invalid_request", `the body nests more than ${MAX_JSON_DEPTH} levels deep`);
  const parsed = schema.safeParse(body ?? {});
  if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
  return parsed.data;
}

/** What every verifier answers on `/verify`: a reward plus optional detail fields. */
export interface VerifyResult {
  reward: number;
  [detail: string]: unknown;
}

/**
 * A verifier is a resources server whose `/verify` judges one request on its own: declared
 * stateless (sessions hold nothing) and replay (verification may run again after a crash).
 */
export abstract class VerifierServer extends ResourcesServer {
  static override readonly checkpointMode: CheckpointMode = "stateless";
  static override readonly checkpointVerify: CheckpointVerify = "replay";
  verifyCalls = 0;

  /** `signal` aborts when a retire covers the request (see SessionAccess.signal). */
  abstract verify(body: unknown, request: FastifyRequest, signal: AbortSignal): Promise<VerifyResult>;

  /**
   * Checks the task a `/seed_session` carries, throwing the refusal `/verify` would answer it with:
   * the reference agent seeds before any policy call, so a task no answer could pass fails there,
   * not after the episode spent its model calls. By default nothing is checked.
   */
  checkSeededTask(_task: JsonValue): void {}

  routes(app: FastifyInstance, sessions: SessionAccess): void {
    app.post("/seed_session", async (request) => {
      const { task } = parseVerifierBody(VerifierSeedBodySchema, request.body);
      // Before the session starts: a refused seed changes nothing.
      if (task !== undefined) this.checkSeededTask(task);
      sessions.require(request);
      return {};
    });
    app.post("/verify", async (request, reply) => {
      this.verifyCalls += 1;
      // Stopped by a retire, or by its client leaving before the answer: nobody would read it, and a
      // sandbox run (or judge call) left going would hold its slot (or connection) to the end.
      const retired = sessions.signal(request);
      const stop = new AbortController();
      const onRetire = () => stop.abort(retired.reason);
      const onClientGone = () => stop.abort(new CheckpointError("unreachable", "the client closed its connection before the verify's answer"));
      if (retired.aborted) onRetire();
      else retired.addEventListener("abort", onRetire, { once: true });
      reply.raw.once("close", onClientGone);
      try {
        return await this.verify(request.body, request, stop.signal);
      } catch (error) {
        const sent = sendVerifierRefusal(reply, error);
        if (sent) return sent;
        throw error;
      } finally {
        retired.removeEventListener("abort", onRetire);
        reply.raw.off("close", onClientGone);
      }
    });
    app.post("/close_session", async (request) => {
      parseVerifierBody(VerifierCloseBodySchema, request.body);
      return {};
    });
  }
}
