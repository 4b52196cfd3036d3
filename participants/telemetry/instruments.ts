import { context, metrics, trace, SpanStatusCode, type Attributes, type Context, type Span } from "@opentelemetry/api";
import { CheckpointError } from "../../protocol/index.js";

/**
 * Participant-side telemetry through @opentelemetry/api only; the daemons wire the SDK.
 * Attribute names share one namespace and never carry tokens or keys.
 */
export const ATTR = {
  checkpointId: "gym_ckpt.checkpoint.id",
  epoch: "gym_ckpt.epoch",
  kind: "gym_ckpt.participant.kind",
  instance: "gym_ckpt.participant.instance",
  op: "gym_ckpt.op",
  phase: "gym_ckpt.phase",
  outcome: "gym_ckpt.outcome",
  code: "gym_ckpt.error.code",
  records: "gym_ckpt.records",
  bytes: "gym_ckpt.bytes",
  blockers: "gym_ckpt.blockers",
  episodes: "gym_ckpt.episodes",
  rollouts: "gym_ckpt.rollouts",
} as const;

const tracer = () => trace.getTracer("gym-ckpt");
const meter = () => metrics.getMeter("gym-ckpt");

let instruments: ReturnType<typeof createInstruments> | undefined;
function createInstruments() {
  const m = meter();
  return {
    opDuration: m.createHistogram("gym_ckpt.participant.op.duration", { unit: "s", description: "Control operation duration by op, kind and outcome" }),
    pause: m.createHistogram("gym_ckpt.participant.pause.duration", { unit: "s", description: "Admission closed until reopened" }),
    records: m.createCounter("gym_ckpt.records", { unit: "{record}", description: "Records written (commit) and read (restore)" }),
    bytes: m.createCounter("gym_ckpt.bytes", { unit: "By", description: "Record bytes written (commit) and read (restore)" }),
    refusals: m.createCounter("gym_ckpt.refusals", { unit: "{refusal}", description: "Refusals by error code" }),
    leaseExpiries: m.createCounter("gym_ckpt.lease.expiries", { unit: "{expiry}", description: "Leases that expired and resumed a participant by itself" }),
    blockersAtDeadline: m.createHistogram("gym_ckpt.prepare.blockers_at_deadline", { unit: "{blocker}", description: "Blockers when a prepare missed its deadline" }),
  };
}
export function participantInstruments() {
  instruments ??= createInstruments();
  return instruments;
}

/** Runs `fn` inside a span; records duration and outcome; errors mark the span with their code. */
export async function withSpan<T>(name: string, attributes: Attributes, parent: Context | undefined, fn: (span: Span) => Promise<T>): Promise<T> {
  const span = parent ? tracer().startSpan(name, { attributes }, parent) : tracer().startSpan(name, { attributes });
  const ctx = trace.setSpan(parent ?? context.active(), span);
  try {
    return await context.with(ctx, () => fn(span));
  } catch (error) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
    if (error instanceof CheckpointError) span.setAttribute(ATTR.code, error.code);
    throw error;
  } finally {
    span.end();
  }
}
