import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader, type MetricData } from "@opentelemetry/sdk-metrics";

/**
 * A meter provider the test reads on demand, cumulative as the Prometheus exporter reads it:
 * `collect()` exports what the instruments hold now and returns those metrics. The test registers
 * it globally (the coordinator's instruments) or injects it (the participants'), and shuts it down.
 */
export function inMemoryMetrics(): { meterProvider: MeterProvider; collect(): Promise<MetricData[]> } {
  const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
  const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 60_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  return {
    meterProvider,
    async collect() {
      await reader.forceFlush();
      return exporter.getMetrics().at(-1)?.scopeMetrics.flatMap((s) => s.metrics) ?? [];
    },
  };
}
