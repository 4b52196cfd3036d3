import {
  context,
  metrics,
  trace,
  SpanStatusCode,
  type Attributes,
  type Context,
  type Meter,
  type MeterProvider,
  type Span,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";
import { DURATION_BUCKETS_S, toCheckpointError } from "../../protocol/index.js";

/**
 * Participant-side telemetry through @opentelemetry/api only; the daemons wire the SDK
 * (see telemetry-sdk.ts). Names, units and attributes are documented in docs/telemetry.md.
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

/** Instrumentation scope of every participant span and instrument. */
export const SCOPE = "gym-ckpt";

let injected: { tracerProvider?: TracerProvider; meterProvider?: MeterProvider } = {};

/**
 * Tests (and embedders that keep their own providers) inject providers instead of relying on the
 * global registration; instruments are re-created on the next use.
 */
export function useTelemetryProviders(providers: { tracerProvider?: TracerProvider; meterProvider?: MeterProvider }): void {
  injected = providers;
  instruments = undefined;
}

const tracer = (): Tracer => (injected.tracerProvider ?? trace.getTracerProvider()).getTracer(SCOPE);
const meter = (): Meter => (injected.meterProvider ?? metrics.getMeterProvider()).getMeter(SCOPE);

/** What the state gauge reads from one live control plane. */
export interface ObservedParticipant {
  kind: string;
  instance: string;
  /**
   * The kind's readiness counts (e.g. `held` responses of the model kind), the blocker count and
   * the last clock offset from the coordinator's (s; positive: this clock ahead), once an op said its send time.
   */
  observe(): { counts: Record<string, number>; blockers: number; clockOffsetS?: number };
}
const observed = new Set<ObservedParticipant>();

/** Registers a control plane for the state gauges; returns the unregister function. */
export function observeParticipant(participant: ObservedParticipant): () => void {
  observed.add(participant);
  // The gauges' callback is registered with the instruments: created now, so a participant's state
  // is observed from its start, not only once its first checkpoint op or refusal created them.
  participantInstruments();
  return () => observed.delete(participant);
}

const seconds = { explicitBucketBoundaries: [...DURATION_BUCKETS_S] };

let instruments: ReturnType<typeof createInstruments> | undefined;
function createInstruments() {
  const m = meter();
  const state = m.createObservableGauge("gym_ckpt.participant.state", {
    unit: "1",
    description: "The kind's readiness counts by name (model: held, inflight, cut, cut_failed, cut_skipped; environment: parked, ...)",
  });
  const blockers = m.createObservableGauge("gym_ckpt.participant.blockers", { unit: "{blocker}", description: "Current readiness blockers" });
  const clockOffset = m.createObservableGauge("gym_ckpt.participant.clock_offset", {
    unit: "s",
    description: "This participant's clock minus the coordinator's at the last op's send time (delivery delay included)",
  });
  m.addBatchObservableCallback(
    (result) => {
      for (const p of observed) {
        let snapshot: ReturnType<ObservedParticipant["observe"]>;
        try {
          snapshot = p.observe();
        } catch {
          continue;
        }
        const base = { kind: p.kind, participant: p.instance };
        result.observe(blockers, snapshot.blockers, base);
        if (snapshot.clockOffsetS !== undefined) result.observe(clockOffset, snapshot.clockOffsetS, base);
        for (const [name, value] of Object.entries(snapshot.counts)) {
          if (Number.isFinite(value)) result.observe(state, value, { ...base, name });
        }
      }
    },
    [state, blockers, clockOffset],
  );
  return {
    opDuration: m.createHistogram("gym_ckpt.participant.op.duration", { unit: "s", description: "Control operation duration by op, kind and outcome", advice: seconds }),
    pause: m.createHistogram("gym_ckpt.participant.pause.duration", { unit: "s", description: "Admission closed until reopened, per participant", advice: seconds }),
    records: m.createCounter("gym_ckpt.records", { unit: "{record}", description: "Records written (commit) and read (restore)" }),
    bytes: m.createCounter("gym_ckpt.bytes", { unit: "By", description: "Record bytes written (commit) and read (restore)" }),
    refusals: m.createCounter("gym_ckpt.refusals", { unit: "{refusal}", description: "Refusals by error code" }),
    leaseExpiries: m.createCounter("gym_ckpt.lease.expiries", { unit: "{expiry}", description: "Leases that expired and resumed a participant by itself" }),
    blockersAtDeadline: m.createHistogram("gym_ckpt.prepare.blockers_at_deadline", { unit: "{blocker}", description: "Blockers when a prepare missed its deadline" }),
    cuts: m.createCounter("gym_ckpt.model.cuts", { unit: "{call}", description: "Generation cuts by outcome (cut, cut_failed, cut_skipped)" }),
    heldResponses: m.createCounter("gym_ckpt.model.held_responses", { unit: "{response}", description: "Responses held while admission was closed" }),
    episodes: m.createCounter("gym_ckpt.episodes", {
      unit: "{episode}",
      description: "Episodes continued from a checkpoint (restore) or marked to restart (restarts at commit)",
    }),
  };
}

export function participantInstruments() {
  instruments ??= createInstruments();
  return instruments;
}

const countedRefusals = new WeakSet<object>();

/**
 * Counts one refusal a participant answered (`gym_ckpt.refusals`, by catalog code and kind), on its
 * control plane or its HTTP data plane. An error object counts once, whichever layers answer it.
 */
export function countRefusal(error: unknown, kind: string): void {
  if (typeof error === "object" && error !== null) {
    if (countedRefusals.has(error)) return;
    countedRefusals.add(error);
  }
  participantInstruments().refusals.add(1, { code: toCheckpointError(error).code, kind });
}

/** Runs `fn` inside a span; errors mark the span (status ERROR and their catalog code). */
export async function withSpan<T>(name: string, attributes: Attributes, parent: Context | undefined, fn: (span: Span) => Promise<T>): Promise<T> {
  const base = parent ?? context.active();
  const span = tracer().startSpan(name, { attributes }, base);
  const ctx = trace.setSpan(base, span);
  try {
    return await context.with(ctx, () => fn(span));
  } catch (error) {
    span.setStatus({ code: SpanStatusCode.ERROR, message: error instanceof Error ? error.message : String(error) });
    // The code the reply carries: a file-system error is answered storage_error, anything else internal_error.
    span.setAttribute(ATTR.code, toCheckpointError(error).code);
    throw error;
  } finally {
    span.end();
  }
}
