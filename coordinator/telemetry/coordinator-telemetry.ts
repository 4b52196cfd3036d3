import { context, metrics, trace, SpanStatusCode, type Attributes, type Context, type Span, type Tracer } from "@opentelemetry/api";
import { DURATION_BUCKETS_S, toCheckpointError } from "../../protocol/index.js";

/** Span attribute names; they never carry tokens. */
export const SPAN_ATTR = {
  checkpointId: "gym_ckpt.checkpoint.id",
  epoch: "gym_ckpt.epoch",
  kind: "gym_ckpt.participant.kind",
  instance: "gym_ckpt.participant.instance",
  op: "gym_ckpt.op",
  stage: "gym_ckpt.stage",
  code: "gym_ckpt.error.code",
  participants: "gym_ckpt.participants",
} as const;

const seconds = { explicitBucketBoundaries: [...DURATION_BUCKETS_S] };

function create() {
  const meter = metrics.getMeter("gym-ckpt");
  return {
    tracer: trace.getTracer("gym-ckpt") as Tracer,
    opDuration: meter.createHistogram("gym_ckpt.coordinator.op.duration", { unit: "s", description: "Controller op duration by op and outcome", advice: seconds }),
    requestDuration: meter.createHistogram("gym_ckpt.coordinator.request.duration", {
      unit: "s",
      description: "One directed participant request by op, kind and outcome",
      advice: seconds,
    }),
    leaderChanges: meter.createCounter("gym_ckpt.coordinator.leader.changes", { unit: "{change}", description: "Lease won or lost" }),
    published: meter.createCounter("gym_ckpt.coordinator.published", { unit: "{checkpoint}", description: "Checkpoints published" }),
  };
}

let instance: ReturnType<typeof create> | undefined;

/** Tracer and meter named "gym-ckpt", through @opentelemetry/api only (daemons wire the SDK). */
export function coordinatorTelemetry() {
  instance ??= create();
  return instance;
}

/**
 * Marks a span failed: status ERROR, and in `gym_ckpt.error.code` the catalog code the reply
 * carries (a file-system error is answered storage_error, anything else internal_error).
 */
export function markSpanFailed(span: Span, error: unknown): void {
  span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
  span.setAttribute(SPAN_ATTR.code, toCheckpointError(error).code);
}

/** Runs `fn` in a child span of `parent` (or the active context); errors mark it failed (markSpanFailed). */
export async function inSpan<T>(name: string, attributes: Attributes, parent: Context | undefined, fn: (ctx: Context, span: Span) => Promise<T>): Promise<T> {
  const base = parent ?? context.active();
  const span = coordinatorTelemetry().tracer.startSpan(name, { attributes }, base);
  const ctx = trace.setSpan(base, span);
  try {
    return await context.with(ctx, () => fn(ctx, span));
  } catch (error) {
    markSpanFailed(span, error);
    throw error;
  } finally {
    span.end();
  }
}
