import { createServer, type Server } from "node:http";
import { metrics } from "@opentelemetry/api";
import type { AddressInfo } from "node:net";
import { CheckpointError, isHttpUrl } from "../../protocol/index.js";
import { commonJsExports } from "../../protocol/commonjs-exports.js";
import { listenRefusal } from "../../protocol/listen-refusal.js";

/**
 * The OTel SDK of the coordinator daemon (library code only uses @opentelemetry/api). A thin copy of
 * participants/telemetry/telemetry-sdk.ts: coordinator/ never imports participants/.
 * Configured by the standard OTEL_* variables plus two flags:
 *
 * - traces go out over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT or
 *   OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or `otlpEndpoint`) is set, or OTEL_TRACES_EXPORTER names an
 *   exporter; JSON encoding unless OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL says otherwise;
 * - metrics go out over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is
 *   set and OTEL_METRICS_EXPORTER allows `otlp`; encoded as OTEL_EXPORTER_OTLP_[METRICS_]PROTOCOL says
 *   (`http/json` by default, `http/protobuf`, `grpc`), like the traces, every OTEL_METRIC_EXPORT_INTERVAL
 *   ms (default 60000; anything but a whole number from 1 to 2^31-1 rejects with `invalid_request`);
 * - a Prometheus `/metrics` endpoint is served when `metricsPort` (or OTEL_EXPORTER_PROMETHEUS_PORT)
 *   is given; 0 picks a free port; host OTEL_EXPORTER_PROMETHEUS_HOST, default 127.0.0.1. A variable
 *   that is not a port rejects with `invalid_request`, and so does a port listen() refuses (in use,
 *   EACCES below 1024), naming the flag or variable, the address and the errno.
 *
 * With none of these (or OTEL_SDK_DISABLED=true) the SDK is not even loaded.
 */
export interface TelemetryOptions {
  serviceName: string;
  /** Resource `service.instance.id` (the participant instance). */
  serviceInstanceId?: string;
  /** OTLP/HTTP base URL (e.g. http://127.0.0.1:4318); replaces OTEL_EXPORTER_OTLP_ENDPOINT and the per-signal endpoints. */
  otlpEndpoint?: string;
  metricsPort?: number;
  metricsHost?: string;
}

export interface TelemetryHandle {
  /** `http://host:port/metrics` when the Prometheus endpoint is served. */
  metricsUrl: string | undefined;
  tracing: boolean;
  /**
   * Whether the SDK runs (false: telemetry is off). Its exporters may then hold the event loop
   * after shutdown() (an OTLP export still retried, up to OTEL_EXPORTER_OTLP_TIMEOUT): a process
   * that ends by letting its loop empty exits explicitly once shutdown() returned.
   */
  started: boolean;
  /** Flushes and stops exporters and the metrics server. */
  shutdown(): Promise<void>;
}

const env = process.env;
/** How long shutdown() waits for the SDK's last flush. */
const SHUTDOWN_WAIT_MS = 2000;
const listed = (name: string) =>
  (env[name] ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);

export async function startTelemetry(options: TelemetryOptions): Promise<TelemetryHandle> {
  const off: TelemetryHandle = { metricsUrl: undefined, tracing: false, started: false, shutdown: async () => undefined };
  if (/^true$/i.test(env.OTEL_SDK_DISABLED ?? "")) return off;
  // The exporters would drop every batch without a word (`127.0.0.1:4318` lacks its scheme). Not
  // echoed: a URL may carry a password.
  if (options.otlpEndpoint !== undefined && !isHttpUrl(options.otlpEndpoint)) {
    throw new CheckpointError("invalid_request", "--otlp-endpoint must be an http:// or https:// URL, e.g. http://127.0.0.1:4318");
  }
  if (options.otlpEndpoint) {
    // The flag wins over the environment (an inherited default collector), per-signal endpoints included.
    env.OTEL_EXPORTER_OTLP_ENDPOINT = options.otlpEndpoint;
    delete env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
    delete env.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT;
  }
  // Likewise an inherited endpoint variable, for every signal that speaks OTLP/HTTP (gRPC takes a bare host:port).
  const grpcTraces = (env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL || env.OTEL_EXPORTER_OTLP_PROTOCOL) === "grpc";
  const grpcMetrics = (env.OTEL_EXPORTER_OTLP_METRICS_PROTOCOL || env.OTEL_EXPORTER_OTLP_PROTOCOL) === "grpc";
  const httpEndpoints = [
    ...(grpcTraces && grpcMetrics ? [] : ["OTEL_EXPORTER_OTLP_ENDPOINT"]),
    ...(grpcTraces ? [] : ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]),
    ...(grpcMetrics ? [] : ["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"]),
  ];
  const malformed = httpEndpoints.find((name) => env[name]?.trim() && !isHttpUrl(env[name].trim()));
  if (malformed) throw new CheckpointError("invalid_request", `${malformed} must be an http:// or https:// URL, e.g. http://127.0.0.1:4318`);

  const tracesExporters = listed("OTEL_TRACES_EXPORTER");
  const tracesEndpoint = Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
  const traces: "env" | "json" | "off" =
    tracesExporters.length > 0
      ? tracesExporters.includes("none")
        ? "off"
        : "env"
      : tracesEndpoint
        ? env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL || env.OTEL_EXPORTER_OTLP_PROTOCOL
          ? "env"
          : "json"
        : "off";
  // OTEL_TRACES_EXPORTER=otlp names the exporter, not its encoding: JSON here too, as the metrics'
  // default, not the SDK's (http/protobuf), unless a protocol variable says otherwise.
  if (traces === "env" && !env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL && !env.OTEL_EXPORTER_OTLP_PROTOCOL) env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "http/json";
  const metricsExporters = listed("OTEL_METRICS_EXPORTER");
  const otlpMetrics =
    Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT || env.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT) && (metricsExporters.length === 0 || metricsExporters.includes("otlp"));
  const envPortText = options.metricsPort === undefined ? env.OTEL_EXPORTER_PROMETHEUS_PORT : undefined;
  // Checked like --metrics-port (decimal, 0-65535), before anything starts: Number() makes "abc" NaN
  // and "0x10" 16, and listen() throws a RangeError. A configuration error, exit 2, not restarted.
  if (envPortText && !(/^\d+$/.test(envPortText.trim()) && Number(envPortText) <= 65535)) {
    throw new CheckpointError("invalid_request", `OTEL_EXPORTER_PROMETHEUS_PORT must be an integer from 0 to 65535 (0 = any free port), got ${JSON.stringify(envPortText)}`);
  }
  const envPort = envPortText ? Number(envPortText) : undefined;
  // Milliseconds, checked likewise: the metric reader throws on a negative one (exit 1, restarted for
  // ever), and a timer takes one past 2^31-1 as 1 ms, exporting without pause.
  const intervalText = otlpMetrics ? env.OTEL_METRIC_EXPORT_INTERVAL?.trim() : undefined;
  if (intervalText && !(/^\d+$/.test(intervalText) && Number(intervalText) >= 1 && Number(intervalText) <= 2_147_483_647)) {
    throw new CheckpointError("invalid_request", `OTEL_METRIC_EXPORT_INTERVAL must be a whole number of milliseconds from 1 to 2147483647, got ${JSON.stringify(env.OTEL_METRIC_EXPORT_INTERVAL)}`);
  }
  const promPort = options.metricsPort ?? (envPort ?? (metricsExporters.includes("prometheus") ? 9464 : undefined));
  if (traces === "off" && !otlpMetrics && promPort === undefined) return off;

  // Loaded only when used: the SDK costs most of a second at start-up (and the bundles leave it in chunks of its own).
  const [{ NodeSDK }, { defaultResource, resourceFromAttributes, envDetector, hostDetector, processDetector }, { PeriodicExportingMetricReader }, { PrometheusExporter }, { OTLPTraceExporter }] =
    await Promise.all([
      commonJsExports(import("@opentelemetry/sdk-node")),
      commonJsExports(import("@opentelemetry/resources")),
      commonJsExports(import("@opentelemetry/sdk-metrics")),
      commonJsExports(import("@opentelemetry/exporter-prometheus")),
      commonJsExports(import("@opentelemetry/exporter-trace-otlp-http")),
    ]);

  const readers: InstanceType<typeof PeriodicExportingMetricReader | typeof PrometheusExporter>[] = [];
  let server: Server | undefined;
  let metricsUrl: string | undefined;
  if (promPort !== undefined) {
    // Our own server: the exporter's would fall back to 9464 for port 0 and bind every interface.
    const prometheus = new PrometheusExporter({ preventServerStart: true });
    readers.push(prometheus);
    // Empty is unset, as for the port: listen("") would bind every interface.
    const host = options.metricsHost ?? (env.OTEL_EXPORTER_PROMETHEUS_HOST?.trim() || "127.0.0.1");
    server = createServer((req, res) => {
      if (req.method === "GET" && (req.url === "/metrics" || req.url?.startsWith("/metrics?"))) prometheus.getMetricsRequestHandler(req, res);
      else res.writeHead(404).end();
    });
    const s = server;
    // Named by what chose the port: the flag, else the variable (else the exporter's default).
    const setting = options.metricsPort !== undefined ? "--metrics-port" : envPort !== undefined ? "OTEL_EXPORTER_PROMETHEUS_PORT" : "OTEL_METRICS_EXPORTER=prometheus";
    await new Promise<void>((resolve, reject) => {
      s.once("error", (error) => reject(listenRefusal(error, setting, host, promPort)));
      s.listen(promPort, host, () => resolve());
    });
    const { port } = s.address() as AddressInfo;
    metricsUrl = `http://${host.includes(":") ? `[${host}]` : host}:${port}/metrics`;
  }
  if (otlpMetrics) {
    const interval = intervalText ? Number(intervalText) : 60_000;
    const { OTLPMetricExporter } = await otlpMetricExporterModule(env.OTEL_EXPORTER_OTLP_METRICS_PROTOCOL || env.OTEL_EXPORTER_OTLP_PROTOCOL);
    readers.push(new PeriodicExportingMetricReader({ exporter: new OTLPMetricExporter(), exportIntervalMillis: interval, exportTimeoutMillis: Math.min(interval, 30_000) }));
  }
  // The process detector's `process.command_args` is the whole argv: `--token`, `--controller-token`
  // and `--cut-token` values would go to every OTLP batch and /metrics' target_info. Leave it out.
  const processWithoutArgs: typeof processDetector = {
    detect(config) {
      const { "process.command_args": _args, ...attributes } = processDetector.detect(config).attributes ?? {};
      return { attributes };
    },
  };
  const sdk = new NodeSDK({
    ...(env.OTEL_SERVICE_NAME ? {} : { serviceName: options.serviceName }),
    resourceDetectors: [envDetector, processWithoutArgs, hostDetector],
    ...(options.serviceInstanceId && { resource: defaultResource().merge(resourceFromAttributes({ "service.instance.id": options.serviceInstanceId })) }),
    metricReaders: readers,
    // Logs stay pino's (stdout, with trace_id/span_id); no OTel log export.
    logRecordProcessors: [],
    ...(traces === "json" ? { traceExporter: new OTLPTraceExporter() } : traces === "off" ? { spanProcessors: [] } : {}),
  });
  sdk.start();
  return {
    metricsUrl,
    tracing: traces !== "off",
    started: true,
    async shutdown() {
      // Bounded: a final export to a collector that refuses or never answers retries for up to
      // OTEL_EXPORTER_OTLP_TIMEOUT (10 s), past a supervisor's grace period; what it had is dropped.
      await Promise.race([sdk.shutdown().catch(() => undefined), new Promise<void>((resolve) => setTimeout(resolve, SHUTDOWN_WAIT_MS).unref())]);
      // Not waiting for its connections: close() waits for every one without a finished request (a
      // connection opened and left silent, a request whose headers never end), for as long as the
      // peer keeps it, and the stopped process would live on. A scrape cut here is the last anyway.
      await new Promise<void>((resolve) => {
        if (!server) return resolve();
        server.close(() => resolve());
        server.closeAllConnections();
      });
    },
  };
}

/** What the leadership gauges read (LeaderLease.state()). */
export interface ObservedLeadership {
  leader: boolean;
  ready: boolean;
  epoch: number | null;
}

/**
 * Gauges of this coordinator's leadership: `gym_ckpt.coordinator.leader.epoch` (the epoch it holds,
 * 0 while it holds none) and `gym_ckpt.coordinator.leader` (1 when the ready leader).
 * Call after startTelemetry; returns a function that stops observing.
 */
export function observeLeadership(state: () => ObservedLeadership): () => void {
  const meter = metrics.getMeter("gym-ckpt");
  const epoch = meter.createObservableGauge("gym_ckpt.coordinator.leader.epoch", { unit: "1", description: "Leader epoch held by this coordinator" });
  const leader = meter.createObservableGauge("gym_ckpt.coordinator.leader", { unit: "1", description: "1 when this coordinator is the ready leader" });
  const callback = (result: { observe(instrument: typeof epoch, value: number): void }) => {
    const s = state();
    result.observe(leader, s.leader && s.ready ? 1 : 0);
    // 0, not skipped: with cumulative temporality (Prometheus) the SDK keeps exporting a gauge's
    // last observation, so a lost lease would go on showing its old epoch. Epochs start at 1.
    result.observe(epoch, s.epoch ?? 0);
  };
  meter.addBatchObservableCallback(callback, [epoch, leader]);
  return () => meter.removeBatchObservableCallback(callback, [epoch, leader]);
}

/** The OTLP metric exporter for the protocol (the traces' choice is the SDK's own, from the same variables). */
function otlpMetricExporterModule(protocol: string | undefined) {
  switch (protocol) {
    case "grpc":
      return commonJsExports(import("@opentelemetry/exporter-metrics-otlp-grpc"));
    case "http/protobuf":
      return commonJsExports(import("@opentelemetry/exporter-metrics-otlp-proto"));
    default:
      return commonJsExports(import("@opentelemetry/exporter-metrics-otlp-http"));
  }
}
