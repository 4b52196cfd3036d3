import { context, metrics, propagation, trace } from "@opentelemetry/api";

/**
 * Unregisters the OpenTelemetry global providers startTelemetry registers, so the next file in a
 * shared unit worker (vitest.config.ts) can register its own.
 */
export function unregisterOtelGlobals(): void {
  for (const api of [trace, metrics, propagation, context]) api.disable();
}
