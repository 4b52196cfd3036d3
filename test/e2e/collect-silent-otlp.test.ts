import { createServer, type Server, type Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { collectHarness } from "./collect-processes.js";

/**
 * `gym-ckpt collect` exporting over OTLP to a collector that accepts connections and never answers
 * (or is down): its telemetry shutdown gives the last export 2 s, and then the process must end. It
 * used to print its summary and stay up until the exporter gave up (OTEL_EXPORTER_OTLP_TIMEOUT,
 * 10 s), holding a batch job's next step.
 */
const { setUp, startCollector } = collectHarness();
/** Well under the ~8 s it stayed up, well over an exit right after the summary on a loaded machine. */
const EXIT_AFTER_SUMMARY_MS = 4000;
let collector: Server;
let collectorUrl: string;
const held: Socket[] = [];

beforeAll(async () => {
  collector = createServer((socket) => {
    held.push(socket);
    socket.resume(); // reads the request, never answers
  });
  await new Promise<void>((resolve) => collector.listen(0, "127.0.0.1", resolve));
  collectorUrl = `http://127.0.0.1:${(collector.address() as { port: number }).port}`;
});

afterAll(async () => {
  for (const socket of held) socket.destroy();
  await new Promise((resolve) => collector.close(resolve));
});

describe("collect with an OTLP collector that never answers", () => {
  it("exits right after its summary (exit 0), not when the last export gives up", { timeout: 90_000 }, async () => {
    const w = await setUp(1);
    const out: string[] = [];
    const collecting = await startCollector(w, [], out, { OTEL_EXPORTER_OTLP_ENDPOINT: collectorUrl, OTEL_BSP_SCHEDULE_DELAY: "50", OTEL_METRIC_EXPORT_INTERVAL: "200" });
    let exited: unknown;
    void collecting.exited.then((outcome) => (exited = outcome));
    await w.waitFor(() => out.some((l) => l.startsWith("rows: 1 (finished 1, failed 0)")) || exited !== undefined, "the summary", 45_000);
    const summaryAt = Date.now();
    const outcome = await Promise.race([collecting.exited, new Promise((r) => setTimeout(() => r("still running"), EXIT_AFTER_SUMMARY_MS + 4000))]);
    expect(outcome, out.join("\n")).toEqual({ code: 0, signal: null });
    expect(Date.now() - summaryAt, out.join("\n")).toBeLessThan(EXIT_AFTER_SUMMARY_MS);
    // It did export (or try to): the collector was connected to.
    expect(held.length).toBeGreaterThan(0);
  });

  it("a SIGTERM still ends it with its stop checkpoint's exit 75, not the summary's code", { timeout: 90_000 }, async () => {
    const w = await setUp(2);
    await w.backend.hold(0);
    const out: string[] = [];
    const collecting = await startCollector(w, [], out, { OTEL_EXPORTER_OTLP_ENDPOINT: collectorUrl, OTEL_BSP_SCHEDULE_DELAY: "50", OTEL_METRIC_EXPORT_INTERVAL: "200" });
    await w.waitFor(async () => (await w.backend.calls()).length >= 2, "the rows running");
    collecting.child.kill("SIGTERM");
    await w.backend.release();
    expect(await collecting.exited, out.join("\n")).toEqual({ code: 75, signal: null });
  });
});
