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
  /** On a fan-out span (a stage, or `.all`): the distinct codes its failing participants answered. */
  codes: "gym_ckpt.error.codes",
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

/** What a fan-out span reads of one participant's outcome (the engine's `Outcome`). */
export type FanOutOutcome = { ok: true } | { ok: false; participant: { kind: string; instance: string }; code: string };

/**
 * A fan-out answers rather than throws when participants fail or refuse: its span is marked here,
 * status ERROR, the distinct codes in `gym_ckpt.error.codes` and one `participant_failed` event per
 * failure. A fan-out where everyone succeeded is left as it is.
 */
export function markFanOutFailures(span: Span, outcomes: readonly FanOutOutcome[]): void {
  const failures = outcomes.filter((o): o is Extract<FanOutOutcome, { ok: false }> => !o.ok);
  if (failures.length === 0) return;
  for (const f of failures) span.addEvent("participant_failed", { [SPAN_ATTR.kind]: f.participant.kind, [SPAN_ATTR.instance]: f.participant.instance, [SPAN_ATTR.code]: f.code });
  span.setAttribute(SPAN_ATTR.codes, [...new Set(failures.map((f) => f.code))].sort());
  span.setStatus({ code: SpanStatusCode.ERROR, message: `${failures.length} of ${outcomes.length} participant(s) failed` });
}

/** `inSpan` for a fan-out: `fn`'s outcomes mark the span (markFanOutFailures), as a throw would. */
export function inFanOutSpan<T extends FanOutOutcome>(name: string, attributes: Attributes, parent: Context | undefined, fn: (ctx: Context) => Promise<T[]>): Promise<T[]> {
  return inSpan(name, attributes, parent, async (ctx, span) => {
    const outcomes = await fn(ctx);
    markFanOutFailures(span, outcomes);
    return outcomes;
  });
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
