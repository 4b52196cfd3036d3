import { createServer, type AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { clearOtelEnv, restoreOtelEnv, unregisterOtelGlobals } from "../../support/otel-globals.js";
import { startTelemetry as coordinatorTelemetry } from "../../../coordinator/telemetry/telemetry-sdk.js";
import { startTelemetry as participantTelemetry } from "../../../participants/telemetry/telemetry-sdk.js";

/**
 * docs/telemetry.md: telemetry configuration that cannot work is refused before anything starts,
 * as `invalid_request` (exit 2: a supervisor does not restart a configuration error), never an
 * internal error (exit 1, restarted for ever) nor a process that silently exports nothing. An
 * empty variable is an unset one.
 */
const saved = { ...process.env };
afterEach(() => {
  unregisterOtelGlobals();
  restoreOtelEnv(saved);
});

/** The refusal, or "started" (then stopped again) when it was not refused. */
async function outcome(start: typeof coordinatorTelemetry, options: Parameters<typeof coordinatorTelemetry>[0]): Promise<unknown> {
  return start(options).then(
    async (handle) => {
      await handle.shutdown();
      return "started";
    },
    (error: unknown) => error,
  );
}

describe.each([
  ["coordinator", coordinatorTelemetry],
  ["participants", participantTelemetry],
])("startTelemetry (%s)", (_side, start) => {
  it("refuses an OTEL_METRIC_EXPORT_INTERVAL that is not a whole number of milliseconds", async () => {
    for (const value of ["-5", "abc", "0.5", "0x10", "3000000000"]) {
      clearOtelEnv();
      process.env.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "http://127.0.0.1:9/v1/metrics";
      process.env.OTEL_METRIC_EXPORT_INTERVAL = value;
      const refused = await outcome(start, { serviceName: "unit" });
      expect(refused, value).toMatchObject({ code: "invalid_request", message: expect.stringContaining(`OTEL_METRIC_EXPORT_INTERVAL must be`) });
    }
    process.env.OTEL_METRIC_EXPORT_INTERVAL = "1000";
    expect(await outcome(start, { serviceName: "unit" })).toBe("started");
  });

  it("refuses an --otlp-endpoint that is not an http(s) URL, without echoing it", async () => {
    clearOtelEnv();
    for (const value of ["127.0.0.1:4318", "not a url", "ftp://user:hunter2@collector:4318"]) {
      const refused = await outcome(start, { serviceName: "unit", otlpEndpoint: value });
      expect(refused, value).toMatchObject({ code: "invalid_request", message: expect.stringContaining("--otlp-endpoint must be an http:// or https:// URL") });
      expect((refused as Error).message).not.toContain("hunter2");
      // Refused before it replaced the inherited endpoint.
      expect(process.env.OTEL_EXPORTER_OTLP_ENDPOINT).toBeUndefined();
    }
  });
  it("refuses an inherited OTLP endpoint variable that is not an http(s) URL, without echoing it, unless its signals speak gRPC or the flag replaces it", async () => {
    for (const name of ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]) {
      for (const value of ["127.0.0.1:4318", "ftp://user:hunter2@collector:4318"]) {
        clearOtelEnv();
        process.env[name] = value;
        const refused = await outcome(start, { serviceName: "unit" });
        expect(refused, `${name}=${value}`).toMatchObject({ code: "invalid_request", message: `${name} must be an http:// or https:// URL, e.g. http://127.0.0.1:4318` });
        expect((refused as Error).message).not.toContain("hunter2");
      }
      // gRPC exporters take host:port as it is.
      process.env[name] = "127.0.0.1:4317";
      process.env.OTEL_EXPORTER_OTLP_PROTOCOL = "grpc";
      expect(await outcome(start, { serviceName: "unit" }), name).toBe("started");
      // The flag replaces the inherited endpoints.
      delete process.env.OTEL_EXPORTER_OTLP_PROTOCOL;
      expect(await outcome(start, { serviceName: "unit", otlpEndpoint: "http://127.0.0.1:9" }), name).toBe("started");
    }
    // Only the signal that speaks OTLP/HTTP is held to it: metrics over gRPC, traces over HTTP.
    clearOtelEnv();
    Object.assign(process.env, { OTEL_EXPORTER_OTLP_ENDPOINT: "127.0.0.1:4317", OTEL_EXPORTER_OTLP_METRICS_PROTOCOL: "grpc" });
    expect(await outcome(start, { serviceName: "unit" })).toMatchObject({ code: "invalid_request", message: expect.stringContaining("OTEL_EXPORTER_OTLP_ENDPOINT must be") });
  });

  it("an empty OTEL_EXPORTER_PROMETHEUS_HOST is unset: /metrics stays on 127.0.0.1, not every interface", async () => {
    clearOtelEnv();
    process.env.OTEL_EXPORTER_PROMETHEUS_HOST = "";
    const handle = await start({ serviceName: "unit", metricsPort: 0 });
    try {
      expect(handle.metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    } finally {
      await handle.shutdown();
    }
  });

  it("refuses a metrics port another process listens on as invalid_request naming the flag or variable, address and errno", async () => {
    clearOtelEnv();
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", () => resolve()));
    const { port } = taken.address() as AddressInfo;
    try {
      expect(await outcome(start, { serviceName: "unit", metricsPort: port })).toMatchObject({
        code: "invalid_request",
        message: `--metrics-port ${port}: cannot listen on 127.0.0.1:${port} (EADDRINUSE: address already in use)`,
      });
      process.env.OTEL_EXPORTER_PROMETHEUS_PORT = String(port);
      expect(await outcome(start, { serviceName: "unit" })).toMatchObject({
        code: "invalid_request",
        message: `OTEL_EXPORTER_PROMETHEUS_PORT ${port}: cannot listen on 127.0.0.1:${port} (EADDRINUSE: address already in use)`,
      });
    } finally {
      await new Promise((resolve) => taken.close(resolve));
    }
  });
});
