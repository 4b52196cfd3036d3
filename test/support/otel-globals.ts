import { context, metrics, propagation, trace } from "@opentelemetry/api";

/**
 * Unregisters the OpenTelemetry global providers startTelemetry registers, so the next file in a
 * shared unit worker (vitest.config.ts) can register its own.
 */
export function unregisterOtelGlobals(): void {
  for (const api of [trace, metrics, propagation, context]) api.disable();
}

/** Removes every `OTEL_*` variable from process.env (in place: the worker's next file shares it). */
export function clearOtelEnv(): void {
  for (const name of Object.keys(process.env)) if (name.startsWith("OTEL_")) delete process.env[name];
}

/** Puts back the `OTEL_*` variables of `saved` (a copy of process.env taken earlier), and only those. */
export function restoreOtelEnv(saved: NodeJS.ProcessEnv): void {
  clearOtelEnv();
  for (const [name, value] of Object.entries(saved)) if (name.startsWith("OTEL_")) process.env[name] = value;
}
