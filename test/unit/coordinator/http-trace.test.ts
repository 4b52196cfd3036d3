import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HttpControllerApi } from "../../../coordinator/api/http-api.js";
import { HttpControllerClient } from "../../../coordinator/client/http-controller-client.js";
import { makeEngine, writers } from "./fake-participants.js";

/** The HTTP controller path carries W3C trace context both ways, as the NATS one does. */
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
let root: string;
let api: HttpControllerApi | undefined;
beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(provider);
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-http-otel-"));
});
afterAll(async () => {
  await api?.stop();
  trace.disable();
  propagation.disable();
  context.disable();
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("HTTP controller API trace context", () => {
  it("the controller's span parents the coordinator's op span", async () => {
    const { engine, leadership } = makeEngine(root);
    api = new HttpControllerApi({ engine, leadership, token: "ctl", host: "127.0.0.1", port: 0 });
    const client = new HttpControllerClient({ baseUrl: await api.start(), token: "ctl" });
    const caller = provider.getTracer("controller").startSpan("controller.step");
    const reply = await context.with(trace.setSpan(context.active(), caller), () => client.prepare({ checkpoint_id: "h1" }));
    caller.end();
    expect(reply.prepared).toBe(true);
    const op = exporter.getFinishedSpans().find((s) => s.name === "checkpoint.coordinate.prepare")!;
    expect(op.spanContext().traceId).toBe(caller.spanContext().traceId);
    expect(op.parentSpanContext?.spanId).toBe(caller.spanContext().spanId);
  });
});
