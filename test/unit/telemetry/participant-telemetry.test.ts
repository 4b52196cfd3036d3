import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { context, propagation, trace, SpanStatusCode } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import type { MetricData } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import Fastify from "fastify";
import { connect, type AddressInfo } from "node:net";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { fakeSubscriptions } from "../../support/fake-subscriptions.js";
import { pino } from "pino";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { ControlEndpoint } from "../../../participants/control-plane/nats-endpoint.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import type { KindReadiness } from "../../../participants/control-plane/participant-kind.js";
import { ATTR, useTelemetryProviders } from "../../../participants/telemetry/instruments.js";
import { createAttachProxy } from "../../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../../participants/attach/upstream-url.js";
import { installRefusalHandlers } from "../../../participants/http/refusal-handlers.js";
import { ModelKind } from "../../../participants/kinds/model/index.js";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CalculatorServer } from "../../../participants/gym/resources-server/calculator-server.js";
import { traceLogFields } from "../../../participants/telemetry/log-correlation.js";
import { extractTraceContext } from "../../../participants/telemetry/nats-propagation.js";
import { HEADER_AUTHORIZATION, toCheckpointError, type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { waitUntil } from "../../support/wait-until.js";

/** Providers injected (no global SDK in vitest); the context manager makes children find their parent. */
const spans = new InMemorySpanExporter();
const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] });
const inMemory = inMemoryMetrics();
const { meterProvider } = inMemory;

let root: string;
beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  useTelemetryProviders({ tracerProvider, meterProvider });
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-tele-unit-"));
});
afterAll(async () => {
  useTelemetryProviders({});
  await meterProvider.shutdown();
  propagation.disable();
  context.disable();
  await rm(root, { recursive: true, force: true });
});
beforeEach(() => spans.reset());

const DEADLINE = () => Date.now() / 1000 + 30;

function capturingLogger() {
  const lines: Record<string, unknown>[] = [];
  const logger = pino({ mixin: traceLogFields }, { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) });
  return { logger, lines };
}

function call(plane: ParticipantControlPlane, op: PhaseOp, body: Record<string, unknown> & { checkpoint_id: string }, parent?: ReturnType<typeof context.active>) {
  const request = { deadline_ts: DEADLINE(), epoch: 3, ...body };
  if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
  if (op === "commit" && !("checkpoint_dir" in body)) createCheckpointDir(root, body.checkpoint_id);
  return plane.handle(op, request as never as RequestInputOf<PhaseOp> as never, parent);
}

const named = (name: string) => spans.getFinishedSpans().filter((s) => s.name === name);
const one = (name: string): ReadableSpan => {
  const found = named(name);
  expect(found, name).toHaveLength(1);
  return found[0]!;
};
const childrenOf = (span: ReadableSpan) =>
  spans
    .getFinishedSpans()
    .filter((s) => s.parentSpanContext?.spanId === span.spanContext().spanId)
    .map((s) => s.name)
    .sort();

async function collect(): Promise<Map<string, MetricData>> {
  return new Map((await inMemory.collect()).map((m) => [m.descriptor.name, m]));
}

describe("participant spans", () => {
  it("checkpoint.<op> spans parented by the coordinator's traceparent, with wait_ready / export / write children", async () => {
    const kind = new ScriptableKind("environment");
    kind.addEpisode({ rollout_id: "r1", attempt: 0 }, { step: 2 });
    kind.addEpisode({ rollout_id: "r2", attempt: 1 }, { step: 5 });
    kind.setRestarts(["r9"]);
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", checkpointRoot: root, logger: pino({ level: "silent" }) });
    // What the coordinator put in the NATS headers.
    const coordinatorSpan = tracerProvider.getTracer("coordinator").startSpan("checkpoint.participant.prepare");
    const h = natsHeaders();
    propagation.inject(trace.setSpan(context.active(), coordinatorSpan), h, { set: (c, k, v) => c.set(k, v) });
    coordinatorSpan.end();
    const parent = extractTraceContext(h);
    try {
      await call(plane, "prepare", { checkpoint_id: "c1" }, parent);
      await call(plane, "commit", { checkpoint_id: "c1" }, parent);
      await call(plane, "resume", { checkpoint_id: "c1" }, parent);
    } finally {
      plane.dispose();
    }
    const traceId = coordinatorSpan.spanContext().traceId;
    const prepare = one("checkpoint.prepare");
    const commit = one("checkpoint.commit");
    const resume = one("checkpoint.resume");
    for (const span of [prepare, commit, resume]) {
      expect(span.spanContext().traceId).toBe(traceId);
      expect(span.parentSpanContext?.spanId).toBe(coordinatorSpan.spanContext().spanId);
      expect(span.instrumentationScope.name).toBe("gym-ckpt");
      expect(span.attributes).toMatchObject({ [ATTR.checkpointId]: "c1", [ATTR.epoch]: 3, [ATTR.kind]: "environment", [ATTR.instance]: "env0" });
    }
    expect(prepare.attributes).toMatchObject({ [ATTR.phase]: "prepared", [ATTR.blockers]: 0 });
    expect(childrenOf(prepare)).toEqual(["wait_ready"]);
    expect(one("wait_ready").attributes).toMatchObject({ [ATTR.blockers]: 0, [ATTR.instance]: "env0" });
    expect(childrenOf(commit)).toEqual(["export", "write"]);
    expect(one("export").attributes).toMatchObject({ [ATTR.records]: 2 });
    const write = one("write");
    expect(write.attributes[ATTR.records]).toBe(2);
    expect(write.attributes[ATTR.bytes]).toBeGreaterThan(0);
    expect(commit.attributes).toMatchObject({ [ATTR.records]: 2, [ATTR.episodes]: 2, [ATTR.bytes]: write.attributes[ATTR.bytes] });
    expect(childrenOf(resume)).toEqual([]);
    // One namespace; nothing that looks like a token or key.
    for (const span of spans.getFinishedSpans()) {
      for (const key of Object.keys(span.attributes)) {
        expect(key.startsWith("gym_ckpt.")).toBe(true);
        expect(key).not.toMatch(/token|key/);
      }
    }

    // Restore into a fresh process: read and install children.
    spans.reset();
    const fresh = new ScriptableKind("environment");
    const restorer = new ParticipantControlPlane({ adapter: fresh, instance: "env0", checkpointRoot: root });
    try {
      await call(restorer, "restore", { checkpoint_id: "c1", checkpoint_dir: join(root, "c1"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    } finally {
      restorer.dispose();
    }
    const restore = one("checkpoint.restore");
    expect(childrenOf(restore)).toEqual(["install", "read"]);
    expect(one("read").attributes).toMatchObject({ [ATTR.records]: 1, [ATTR.kind]: "environment" });
    expect(one("install").attributes).toMatchObject({ [ATTR.records]: 1 });
    expect(restore.attributes).toMatchObject({ [ATTR.episodes]: 1, [ATTR.records]: 1 });
  });

  it("wait_ready ended by a throw still records the blockers it waited on", async () => {
    // A kind whose readiness check throws once told to (a kind's own failure mid-wait).
    class BreakingKind extends ScriptableKind {
      calls_ = 0;
      broken = false;
      override readiness(): KindReadiness {
        this.calls_++;
        if (this.broken) throw new Error("readiness check crashed");
        return super.readiness();
      }
    }
    const kind = new BreakingKind("environment");
    kind.setBlockers(["held/1", "held/2"]);
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", checkpointRoot: root, logger: pino({ level: "silent" }) });
    try {
      const prepare = call(plane, "prepare", { checkpoint_id: "w1" }).then(
        () => undefined,
        (error: unknown) => error,
      );
      await waitUntil(() => plane.status().phase === "preparing" && kind.calls_ > 1, "prepare waiting on its blockers");
      kind.broken = true;
      kind.setBlockers(["held/1", "held/2"]); // wakes the wait, whose next check throws
      expect(await prepare).toBeDefined();
    } finally {
      plane.dispose();
    }
    const waited = one("wait_ready");
    expect(waited.status.code).toBe(SpanStatusCode.ERROR);
    expect(waited.attributes[ATTR.blockers]).toBe(2);
  });

  it("a refusal marks the op span with its catalog code and is logged inside it (trace_id, span_id)", async () => {
    const { logger, lines } = capturingLogger();
    const plane = new ParticipantControlPlane({ adapter: new ScriptableKind("agent"), instance: "a0", checkpointRoot: root, logger });
    try {
      await expect(call(plane, "commit", { checkpoint_id: "never-prepared" })).rejects.toMatchObject({ code: "invalid_phase" });
    } finally {
      plane.dispose();
    }
    const commit = one("checkpoint.commit");
    expect(commit.status.code).toBe(2); // ERROR
    expect(commit.attributes[ATTR.code]).toBe("invalid_phase");
    expect(lines.find((l) => l.msg === "control operation refused")).toMatchObject({
      code: "invalid_phase",
      trace_id: commit.spanContext().traceId,
      span_id: commit.spanContext().spanId,
    });
  });

  it("a commit failing on storage marks its span with the code it answers (storage_error), not only status ERROR", async () => {
    const kind = new ScriptableKind("agent");
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "a0", checkpointRoot: root });
    // The kind's export reads a file the disk lost: a real ENOENT of open(2).
    kind.failNext("exportRecords", (await readFile(join(root, "lost-by-the-disk")).catch((error: unknown) => error)) as Error);
    try {
      await call(plane, "prepare", { checkpoint_id: "disk-1" });
      await expect(call(plane, "commit", { checkpoint_id: "disk-1" })).rejects.toSatisfy(
        (error: unknown) => toCheckpointError(error).code === "storage_error",
      );
    } finally {
      plane.dispose();
    }
    const commit = one("checkpoint.commit");
    expect(commit.status.code).toBe(2); // ERROR
    expect(commit.attributes[ATTR.code]).toBe("storage_error");
  });

  it("the NATS endpoint answers in the coordinator's trace context: its own error lines carry the trace_id", async () => {
    const { logger, lines } = capturingLogger();
    const kind = new ScriptableKind("environment");
    kind.failNext("closeAdmission", new Error("disk on fire"));
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "env9", checkpointRoot: root, logger });
    const inbox = fakeSubscriptions();
    const endpoint = new ControlEndpoint(plane as never, { nc: inbox.nc, deployment: "unit", token: "tok", logger });
    endpoint.start();
    const coordinatorSpan = tracerProvider.getTracer("coordinator").startSpan("checkpoint.participant.prepare");
    const h = natsHeaders();
    h.set(HEADER_AUTHORIZATION, "Bearer tok");
    propagation.inject(trace.setSpan(context.active(), coordinatorSpan), h, { set: (c, k, v) => c.set(k, v) });
    coordinatorSpan.end();
    try {
      const reply = await inbox.request("prepare", h, JSON.stringify({ checkpoint_id: "c-fire", deadline_ts: DEADLINE(), epoch: 3 }));
      expect(JSON.parse(reply)).toMatchObject({ error: { code: "internal_error" } });
    } finally {
      await endpoint.stop();
      plane.dispose();
    }
    const traceId = coordinatorSpan.spanContext().traceId;
    const prepare = one("checkpoint.prepare");
    expect(lines.find((l) => l.msg === "control operation refused")).toMatchObject({ trace_id: traceId, span_id: prepare.spanContext().spanId });
    // Logged by the endpoint after the op's span ended: still the coordinator's trace.
    expect(lines.find((l) => l.msg === "control operation failed")).toMatchObject({ trace_id: traceId, span_id: coordinatorSpan.spanContext().spanId });
  });
});

describe("participant metrics", () => {
  it("names, units and attributes", async () => {
    const kind = new ScriptableKind("resources");
    kind.addEpisode({ rollout_id: "m1", attempt: 0 });
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "res0", checkpointRoot: root });
    try {
      await call(plane, "prepare", { checkpoint_id: "m-c1" });
      await call(plane, "commit", { checkpoint_id: "m-c1" });
      await call(plane, "resume", { checkpoint_id: "m-c1" });
      await expect(call(plane, "commit", { checkpoint_id: "m-c2" })).rejects.toMatchObject({ code: "invalid_phase" });
      const metrics = await collect();
      const units = Object.fromEntries([...metrics].map(([name, m]) => [name, m.descriptor.unit]));
      expect(units).toMatchObject({
        "gym_ckpt.participant.op.duration": "s",
        "gym_ckpt.participant.pause.duration": "s",
        "gym_ckpt.records": "{record}",
        "gym_ckpt.bytes": "By",
        "gym_ckpt.refusals": "{refusal}",
        "gym_ckpt.participant.state": "1",
        "gym_ckpt.participant.blockers": "{blocker}",
      });
      const points = (name: string) => metrics.get(name)!.dataPoints.map((p) => p.attributes);
      expect(points("gym_ckpt.participant.op.duration")).toEqual(
        expect.arrayContaining([
          { op: "prepare", kind: "resources", outcome: "ok" },
          { op: "commit", kind: "resources", outcome: "ok" },
          { op: "commit", kind: "resources", outcome: "error" },
        ]),
      );
      expect(points("gym_ckpt.participant.pause.duration")).toContainEqual({ kind: "resources", participant: "res0" });
      expect(points("gym_ckpt.refusals")).toContainEqual({ code: "invalid_phase", kind: "resources" });
      const records = metrics.get("gym_ckpt.records")!.dataPoints.find((p) => p.attributes.kind === "resources" && p.attributes.op === "commit")!;
      expect(records.value).toBe(1);
      const state = metrics.get("gym_ckpt.participant.state")!.dataPoints.find((p) => p.attributes.participant === "res0" && p.attributes.name === "episodes")!;
      expect(state.value).toBe(1);
    } finally {
      plane.dispose();
    }
  });
});

describe("data-plane refusals", () => {
  /** The cumulative count of one (code, kind) series so far. */
  async function refusals(code: string, kind: string): Promise<number> {
    const metric = (await collect()).get("gym_ckpt.refusals");
    const point = metric?.dataPoints.find((p) => p.attributes.code === code && p.attributes.kind === kind);
    return (point?.value as number | undefined) ?? 0;
  }

  it("the model proxy counts a generation call without the rollout prefix (rollout_id_required)", async () => {
    const kind = new ModelKind({ ledgerDir: join(root, "ledger-refusals"), cutBackend: null });
    // Refused before any upstream is contacted: nothing listens there.
    const proxy = createAttachProxy({ upstream: parseUpstream("http://127.0.0.1:9/v1"), kind, controlToken: "t" });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    try {
      const before = await refusals("rollout_id_required", "model");
      const res = await fetch(`http://127.0.0.1:${(proxy.address() as AddressInfo).port}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
      });
      expect(res.status).toBe(400);
      expect(await res.json()).toMatchObject({ error: { code: "rollout_id_required" } });
      expect(await refusals("rollout_id_required", "model")).toBe(before + 1);
    } finally {
      proxy.closeAllConnections();
      await new Promise((resolve) => proxy.close(resolve));
      await kind.close();
    }
  });

  it("a resources server counts its middleware's and its error handler's refusals", async () => {
    const { app } = await createResourcesApp(new CalculatorServer());
    try {
      const before = await refusals("rollout_id_required", "resources");
      const beforeMissing = await refusals("not_found", "resources");
      expect((await app.inject({ method: "POST", url: "/seed_session", payload: {} })).json()).toMatchObject({ error: { code: "rollout_id_required" } });
      expect((await app.inject({ method: "GET", url: "/nowhere" })).statusCode).toBe(404);
      expect(await refusals("rollout_id_required", "resources")).toBe(before + 1);
      expect(await refusals("not_found", "resources")).toBe(beforeMissing + 1);
    } finally {
      await app.close();
    }
  });

  it("a resources server answers what Node refuses before any route (a bad header, an unknown Expect) with counted catalog refusals, and serves a request without Host", async () => {
    const { app } = await createResourcesApp(new CalculatorServer());
    await app.listen({ host: "127.0.0.1", port: 0 });
    const { port } = app.server.address() as AddressInfo;
    /** Writes `text` and returns what the server wrote before it closed the connection. */
    const exchange = (text: string) =>
      new Promise<string>((resolve, reject) => {
        const socket = connect(port, "127.0.0.1", () => socket.write(text));
        let received = "";
        socket.on("data", (chunk: Buffer) => (received += chunk.toString()));
        socket.on("error", reject);
        socket.on("close", () => resolve(received));
      });
    try {
      const before = await refusals("invalid_request", "resources");
      for (const head of ["POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", "GET /nowhere HTTP/1.1\r\nHost: x\r\nExpect: foo\r\n\r\n"]) {
        const response = await exchange(head);
        expect(response.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request");
        expect(JSON.parse(response.slice(response.indexOf("\r\n\r\n") + 4))).toMatchObject({ error: { code: "invalid_request" } });
      }
      expect(await refusals("invalid_request", "resources")).toBe(before + 2);
      // No Host: routed like any request (here to not_found), not Node's bare 400.
      const hostless = await exchange("GET /nowhere HTTP/1.1\r\nConnection: close\r\n\r\n");
      expect(hostless.split("\r\n")[0]).toBe("HTTP/1.1 404 Not Found");
    } finally {
      await app.close();
    }
  });

  it("a refusal the control plane counted and an HTTP layer answers again counts once", async () => {
    const kind = new ScriptableKind("agent");
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "agent-once", checkpointRoot: root });
    const app = Fastify({ logger: false });
    installRefusalHandlers(app, "test server", "agent");
    app.post("/commit", async () => call(plane, "commit", { checkpoint_id: "once-c1" }));
    try {
      const before = await refusals("invalid_phase", "agent");
      expect((await app.inject({ method: "POST", url: "/commit" })).json()).toMatchObject({ error: { code: "invalid_phase" } });
      expect(await refusals("invalid_phase", "agent")).toBe(before + 1);
    } finally {
      plane.dispose();
      await app.close();
    }
  });
});

describe("log correlation", () => {
  it("pino lines inside a span carry trace_id / span_id; outside none", () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino({ mixin: traceLogFields }, { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) });
    const span = tracerProvider.getTracer("t").startSpan("op");
    context.with(trace.setSpan(context.active(), span), () => logger.info("inside"));
    span.end();
    logger.info("outside");
    expect(lines[0]).toMatchObject({ msg: "inside", trace_id: span.spanContext().traceId, span_id: span.spanContext().spanId, trace_flags: "01" });
    expect(lines[1]!.trace_id).toBeUndefined();
  });
});
