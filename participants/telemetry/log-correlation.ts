import { trace } from "@opentelemetry/api";

/**
 * pino `mixin` for log correlation: the active span's ids under the field names OTel's pino
 * instrumentation uses (trace_id, span_id, trace_flags); nothing outside a span.
 */
export function traceLogFields(): Record<string, string> {
  const span = trace.getActiveSpan()?.spanContext();
  if (!span || !trace.isSpanContextValid(span)) return {};
  return { trace_id: span.traceId, span_id: span.spanId, trace_flags: `0${span.traceFlags.toString(16)}` };
}
