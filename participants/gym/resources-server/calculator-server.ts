import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { CheckpointError, describeZodError } from "../../../protocol/index.js";
import { ResourcesServer, type CheckpointMode, type CheckpointVerify, type SessionAccess } from "../../kinds/resources/index.js";
import { requireJsonPost } from "../admin-json-post.js";
import { MAX_EXPRESSION_LENGTH, calculate } from "./arithmetic-expression.js";

/** The environment's task is opaque to us except for the expression it must compute. */
export const CalculatorTaskSchema = z.object({ expression: z.string().min(1).max(MAX_EXPRESSION_LENGTH) }).catchall(z.json());
export const SeedBodySchema = z.object({ task: CalculatorTaskSchema.optional() }).strict();
export const CalculatorToolBodySchema = z.object({ expression: z.string().min(1).max(MAX_EXPRESSION_LENGTH) }).strict();
/**
 * `answer` has no length limit of its own (the body limit bounds it): a policy that answers at length
 * is scored 0 like any wrong answer, never refused, which failed its whole episode invalid_request.
 */
export const VerifyBodySchema = z.object({ task: CalculatorTaskSchema, answer: z.string() }).strict();
export const EmptyBodySchema = z.object({}).strict();

export function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  const parsed = schema.safeParse(body ?? {});
  if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
  return parsed.data;
}

/** Counters tests read through `GET /admin/stats`, and a hold that keeps `/verify` in flight. */
export class VerifyControls {
  stats = { seeds: 0, tool_calls: 0, verify_started: 0, verify_finished: 0, closes: 0 };
  private held: Promise<void> | undefined;
  private releaseHeld: (() => void) | undefined;

  hold(): void {
    if (this.held) return;
    this.held = new Promise((resolve) => (this.releaseHeld = resolve));
  }

  release(): void {
    this.releaseHeld?.();
    this.held = undefined;
    this.releaseHeld = undefined;
  }

  async pass(): Promise<void> {
    if (this.held) await this.held;
  }

  routes(app: FastifyInstance): void {
    // Outside the checkpoint middleware (GET, or `checkpointing: false`): these routes only observe
    // and gate the test, also while a checkpoint is open. The hold and release change state, so they
    // take a JSON POST only (requireJsonPost): a web page cannot hold every /verify.
    app.get("/admin/stats", async () => this.stats);
    app.post("/admin/verify/hold", { config: { checkpointing: false } }, async (request) => {
      requireJsonPost(request);
      this.hold();
      return { held: true };
    });
    app.post("/admin/verify/release", { config: { checkpointing: false } }, async (request) => {
      requireJsonPost(request);
      this.release();
      return { held: false };
    });
  }
}

/**
 * The reference calculator tool server. Stateless (a session holds nothing a continuation needs)
 * and its `/verify` is pure, so it may be replayed after a crash.
 */
export class CalculatorServer extends ResourcesServer {
  static override readonly checkpointMode: CheckpointMode = "stateless";
  static override readonly checkpointVerify: CheckpointVerify = "replay";
  readonly controls = new VerifyControls();

  routes(app: FastifyInstance, sessions: SessionAccess): void {
    app.post("/seed_session", async (request) => {
      parseBody(SeedBodySchema, request.body);
      sessions.require(request);
      this.controls.stats.seeds += 1;
      return {};
    });
    app.post("/tools/calculator", async (request) => {
      const body = parseBody(CalculatorToolBodySchema, request.body);
      this.controls.stats.tool_calls += 1;
      return { result: calculate(body.expression) };
    });
    app.post("/verify", async (request) => {
      const body = parseBody(VerifyBodySchema, request.body);
      this.controls.stats.verify_started += 1;
      await this.controls.pass();
      const expected = calculate(body.task.expression);
      this.controls.stats.verify_finished += 1;
      return { reward: body.answer.trim() === expected ? 1 : 0 };
    });
    app.post("/close_session", async (request) => {
      parseBody(EmptyBodySchema, request.body);
      this.controls.stats.closes += 1;
      return {};
    });
  }
}

/** The same server under other declarations, for tests of every mode (declarations stay on a class). */
export function calculatorServerClass(mode: CheckpointMode, verify: CheckpointVerify): new () => CalculatorServer {
  return class extends CalculatorServer {
    static override readonly checkpointMode = mode;
    static override readonly checkpointVerify = verify;
  };
}
