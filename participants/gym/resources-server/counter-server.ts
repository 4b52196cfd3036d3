import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { CheckpointError, describeZodError } from "../../../protocol/index.js";
import { ResourcesServer, type CheckpointMode, type CheckpointVerify, type JsonValue, type SessionAccess } from "../../kinds/resources/index.js";
import { EmptyBodySchema, parseBody } from "./calculator-server.js";

export const CounterStateSchema = z.object({ count: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER) }).strict();
const CounterVerifyBodySchema = z.object({ expected: z.number().int() }).strict();
/** The environment seeds with its task, opaque here. */
const CounterSeedBodySchema = z.object({ task: z.json().optional() }).strict();

/**
 * An `exported`-mode example: each session holds a counter. Its state survives a crash through
 * the export / restore / retire hooks. A session this process does not know (its state was lost)
 * starts again from 0, so a missing restore shows up as a wrong value rather than an error.
 */
export class CounterServer extends ResourcesServer {
  static override readonly checkpointMode: CheckpointMode = "exported";
  static override readonly checkpointVerify: CheckpointVerify = "wait";
  readonly counters = new Map<string, number>();
  readonly parked: string[][] = [];

  routes(app: FastifyInstance, sessions: SessionAccess): void {
    app.post("/seed_session", async (request) => {
      parseBody(CounterSeedBodySchema, request.body);
      const { sessionId } = sessions.require(request);
      this.counters.set(sessionId, 0);
      return {};
    });
    app.post("/increment", async (request) => {
      parseBody(EmptyBodySchema, request.body);
      const { sessionId } = sessions.require(request);
      const count = (this.counters.get(sessionId) ?? 0) + 1;
      this.counters.set(sessionId, count);
      return { count };
    });
    app.post("/verify", async (request) => {
      const body = parseBody(CounterVerifyBodySchema, request.body);
      const { sessionId } = sessions.require(request);
      const count = this.counters.get(sessionId) ?? 0;
      this.counters.delete(sessionId);
      return { reward: count === body.expected ? 1 : 0, count };
    });
    app.post("/close_session", async (request) => {
      parseBody(EmptyBodySchema, request.body);
      const found = sessions.of(request);
      if (found?.sessionId) this.counters.delete(found.sessionId);
      return {};
    });
  }

  override async exportSessionStates(sessionIds: string[]): Promise<Record<string, JsonValue>> {
    // Null prototype: on a `{}`, `states["__proto__"] = …` would set the prototype, and that session would not be exported.
    const states: Record<string, JsonValue> = Object.create(null);
    for (const id of sessionIds) {
      const count = this.counters.get(id);
      if (count !== undefined) states[id] = { count };
    }
    return states;
  }

  /** Validates every state before installing any. */
  override async restoreSessionStates(states: Record<string, JsonValue>): Promise<void> {
    const parsed = new Map<string, number>();
    for (const [id, state] of Object.entries(states)) {
      const result = CounterStateSchema.safeParse(state);
      if (!result.success) throw new CheckpointError("invalid_checkpoint_state", `counter state of a session is invalid: ${describeZodError(result.error)}`);
      parsed.set(id, result.data.count);
    }
    for (const [id, count] of parsed) this.counters.set(id, count);
  }

  override async retireSessionState(sessionId: string): Promise<void> {
    this.counters.delete(sessionId);
  }

  override async parkSessionStates(sessionIds: string[]): Promise<void> {
    this.parked.push([...sessionIds]);
  }
}
