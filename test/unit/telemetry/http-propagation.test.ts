import { context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import Fastify, { type FastifyInstance } from "fastify";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clearOtelEnv, restoreOtelEnv } from "../../support/otel-globals.js";
import { runCutRound } from "../../../participants/kinds/model/generation-cut-round.js";
import { propagateHttpTraceContext } from "../../../participants/telemetry/http-propagation.js";
import { startTelemetry } from "../../../participants/telemetry/telemetry-sdk.js";

const spans = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] });
let unsubscribe: () => void;
const apps: FastifyInstance[] = [];
const saved = { ...process.env };

beforeAll(() => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  unsubscribe = propagateHttpTraceContext();
});
afterAll(async () => {
  unsubscribe();
  await Promise.all(apps.map((a) => a.close()));
  trace.disable();
  propagation.disable();
  context.disable();
  restoreOtelEnv(saved);
});

describe("data-plane trace context", () => {
  it("fastify apps get a SERVER span from the caller's traceparent; fetch carries the handler's context on", async () => {
    // Created after the subscription, as the reference servers are (startServerRuntime comes first).
    const downstream = Fastify();
    let seen: string | undefined;
    downstream.post("/b", async (request) => {
      seen = request.headers.traceparent as string | undefined;
      return { ok: true };
    });
    const upstream = Fastify();
    let downstreamUrl = "";
    upstream.post("/a/:id", async () => {
      const response = await fetch(`${downstreamUrl}/b`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
      return response.json();
    });
    apps.push(downstream, upstream);
    downstreamUrl = await downstream.listen({ host: "127.0.0.1", port: 0 });
    const upstreamUrl = await upstream.listen({ host: "127.0.0.1", port: 0 });

    const caller = provider.getTracer("test").startSpan("caller");
    const headers: Record<string, string> = { "content-type": "application/json" };
    propagation.inject(trace.setSpan(context.active(), caller), headers);
    caller.end();
    const response = await fetch(`${upstreamUrl}/a/x1`, { method: "POST", headers, body: JSON.stringify({ n: 1 }) });
    expect(await response.json()).toEqual({ ok: true });

    const finished = spans.getFinishedSpans();
    const a = finished.find((s) => s.name === "POST /a/:id")!;
    const b = finished.find((s) => s.name === "POST /b")!;
    expect(a.kind).toBe(1); // SERVER
    expect(a.attributes).toMatchObject({ "http.route": "/a/:id", "http.request.method": "POST", "http.response.status_code": 200 });
    expect(a.parentSpanContext?.spanId).toBe(caller.spanContext().spanId);
    expect(a.spanContext().traceId).toBe(caller.spanContext().traceId);
    // The handler's fetch carried the upstream server span as parent (after body parsing, too).
    expect(seen).toBe(`00-${caller.spanContext().traceId}-${a.spanContext().spanId}-01`);
    expect(b.parentSpanContext?.spanId).toBe(a.spanContext().spanId);
  });

  it("the model's generation-cut request (node:http) carries the prepare's trace context to the backend", async () => {
    // Node 20 publishes a node:http request on its diagnostics channel only once its headers are
    // sent, too late to add traceparent there; the cut round is part of the checkpoint's trace.
    let seen: string | undefined;
    const backend = createServer((request, response) => {
      seen = request.headers.traceparent as string | undefined;
      request.resume();
      response.writeHead(500).end();
    });
    await new Promise<void>((resolve) => backend.listen(0, "127.0.0.1", resolve));
    try {
      const prepare = provider.getTracer("test").startSpan("checkpoint.prepare");
      const cutBackend = { root: `http://127.0.0.1:${(backend.address() as AddressInfo).port}`, token: "cut-token-0123456789", timeoutMs: 5_000, serverName: "model0" };
      const round = await context.with(trace.setSpan(context.active(), prepare), () => runCutRound(cutBackend, "c1", []));
      prepare.end();
      expect(round.error).toContain("HTTP 500");
      expect(seen).toBe(`00-${prepare.spanContext().traceId}-${prepare.spanContext().spanId}-01`);
    } finally {
      await new Promise((resolve) => backend.close(resolve));
    }
  });

  it("an untraced request starts no trace context in outgoing calls", async () => {
    const echo = Fastify();
    echo.get("/h", async (request) => ({ traceparent: request.headers.traceparent ?? null }));
    apps.push(echo);
    const url = await echo.listen({ host: "127.0.0.1", port: 0 });
    expect(await (await fetch(`${url}/h`)).json()).toEqual({ traceparent: null });
  });
});

describe("telemetry SDK wiring", () => {
  it("stays unloaded when no exporter, endpoint or metrics port is configured", async () => {
    clearOtelEnv();
    const handle = await startTelemetry({ serviceName: "unit" });
    expect(handle.tracing).toBe(false);
    expect(handle.metricsUrl).toBeUndefined();
    await handle.shutdown();
  });
});
