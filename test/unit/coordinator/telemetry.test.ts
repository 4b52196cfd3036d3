import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { context, propagation, trace, SpanStatusCode } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import type { MsgHdrs } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsParticipantTransport } from "../../../coordinator/engine/nats-transport.js";
import { SPAN_ATTR } from "../../../coordinator/telemetry/coordinator-telemetry.js";
import { createLogger } from "../../../coordinator/telemetry/logger.js";
import { toCheckpointError } from "../../../protocol/index.js";
import { echoNatsConnection } from "../../support/echo-nats-connection.js";
import { makeEngine, writers } from "./fake-participants.js";

const exporter = new InMemorySpanExporter();
let root: string;
beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-otel-"));
});
afterAll(async () => {
  trace.disable();
  propagation.disable();
  context.disable();
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("coordinator telemetry", () => {
  it("one trace per op: checkpoint.coordinate.<op>, a child per stage, a child per participant request", async () => {
    exporter.reset();
    const { engine } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "t1" });
    const spans = exporter.getFinishedSpans();
    const root_ = spans.find((s) => s.name === "checkpoint.coordinate.prepare")!;
    expect(root_).toBeDefined();
    expect(root_.instrumentationScope.name).toBe("gym-ckpt");
    const stages = spans.filter((s) => s.name.startsWith("checkpoint.coordinate.prepare.stage."));
    expect(stages.map((s) => s.name)).toEqual([
      "checkpoint.coordinate.prepare.stage.environment",
      "checkpoint.coordinate.prepare.stage.model",
      "checkpoint.coordinate.prepare.stage.agent",
      "checkpoint.coordinate.prepare.stage.resources",
    ]);
    for (const stage of stages) expect(stage.parentSpanContext?.spanId).toBe(root_.spanContext().spanId);
    const requests = spans.filter((s) => s.name === "checkpoint.participant.prepare");
    expect(requests).toHaveLength(5);
    const stageIds = new Set(stages.map((s) => s.spanContext().spanId));
    for (const r of requests) {
      expect(stageIds.has(r.parentSpanContext!.spanId)).toBe(true);
      expect(r.spanContext().traceId).toBe(root_.spanContext().traceId);
    }
  });

  it("controller_op_failed is logged inside the op span: it carries the op's trace_id without a controller context", async () => {
    exporter.reset();
    const lines: Record<string, unknown>[] = [];
    const { engine } = makeEngine(root, { logger: createLogger("info", { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) }) });
    await expect(engine.commit({ checkpoint_id: "never-prepared", episode_ids: null, stop: false })).rejects.toMatchObject({ code: "not_found" });
    const op = exporter.getFinishedSpans().find((s) => s.name === "checkpoint.coordinate.commit")!;
    expect(op.parentSpanContext).toBeUndefined();
    expect(lines.find((l) => l.msg === "controller_op_failed")).toMatchObject({ code: "not_found", trace_id: op.spanContext().traceId, span_id: op.spanContext().spanId });
  });

  it("an op failing on storage marks its span with the code it answers (storage_error), not only status ERROR", async () => {
    exporter.reset();
    const dir = join(root, "blocked");
    await mkdir(dir); // as the daemon makes its root at start (the writer never makes a root)
    const { engine } = makeEngine(dir);
    await engine.prepare({ checkpoint_id: "s1" });
    await engine.commit({ checkpoint_id: "s1", episode_ids: null, stop: false });
    // A file where the staged checkpoint directory was: publication's write fails with ENOTDIR.
    await rm(join(dir, "s1"), { recursive: true, force: true });
    await writeFile(join(dir, "s1"), "not a directory");
    await expect(engine.publish({ checkpoint_id: "s1", controller_state: null })).rejects.toSatisfy((error: unknown) => toCheckpointError(error).code === "storage_error");
    const op = exporter.getFinishedSpans().find((s) => s.name === "checkpoint.coordinate.publish")!;
    expect(op.status.code).toBe(SpanStatusCode.ERROR);
    expect(op.attributes[SPAN_ATTR.code]).toBe("storage_error");
  });

  it("an op refused not_leader before recovery still has its span, in the controller's trace, with the code (its log line at debug)", async () => {
    exporter.reset();
    const lines: Record<string, unknown>[] = [];
    const { engine } = makeEngine(join(root, "unrecovered"), {
      requireRecovery: true,
      logger: createLogger("debug", { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) }),
    });
    const controller = trace.getTracer("controller").startSpan("controller.checkpoint");
    await expect(context.with(trace.setSpan(context.active(), controller), () => engine.prepare({ checkpoint_id: "n1" }))).rejects.toMatchObject({ code: "not_leader" });
    controller.end();
    const op = exporter.getFinishedSpans().find((s) => s.name === "checkpoint.coordinate.prepare");
    expect(op).toBeDefined();
    expect(op!.parentSpanContext?.spanId).toBe(controller.spanContext().spanId);
    expect(op!.status.code).toBe(SpanStatusCode.ERROR);
    expect(op!.attributes[SPAN_ATTR.code]).toBe("not_leader");
    // Debug (20), not warn: clients retrying not_leader ask a follower every 100 ms.
    expect(lines.find((l) => l.msg === "controller_op_failed")).toMatchObject({ level: 20, code: "not_leader", trace_id: controller.spanContext().traceId, span_id: op!.spanContext().spanId });
    // A checkpoint op naming no id, refused so: no id was made up for its span or its log line.
    lines.length = 0;
    await expect(engine.checkpoint({ episode_ids: null, stop: false, controller_state: null })).rejects.toMatchObject({ code: "not_leader" });
    expect(exporter.getFinishedSpans().find((s) => s.name === "checkpoint.coordinate.checkpoint")!.attributes).not.toHaveProperty(SPAN_ATTR.checkpointId);
    expect(lines.find((l) => l.msg === "controller_op_failed")).not.toHaveProperty("checkpoint_id");
  });

  it("op spans and failure logs carry the real checkpoint id, or none: never LATEST, retire or forget", async () => {
    exporter.reset();
    const lines: Record<string, unknown>[] = [];
    await mkdir(join(root, "ids"));
    const { engine } = makeEngine(join(root, "ids"), { logger: createLogger("info", { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) }) });
    const opSpan = (name: string) => exporter.getFinishedSpans().filter((s) => s.name === `checkpoint.coordinate.${name}`).at(-1)!;
    const ID = SPAN_ATTR.checkpointId;

    // Nothing published: the restore of LATEST names no checkpoint.
    await expect(engine.restore({ episode_ids: [] })).rejects.toMatchObject({ code: "not_found" });
    expect(opSpan("restore").attributes).not.toHaveProperty(ID);
    const failed = lines.find((l) => l.msg === "controller_op_failed" && l.op === "restore")!;
    expect(failed).toBeDefined();
    expect(failed).not.toHaveProperty("checkpoint_id");

    // Outside a checkpoint, retire and forget name none either.
    await engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await engine.forget({ rollout_ids: ["r1"] });
    expect(opSpan("retire").attributes).not.toHaveProperty(ID);
    expect(opSpan("forget").attributes).not.toHaveProperty(ID);

    // The restore of LATEST names the checkpoint it restores; a retire inside it names that one too.
    await engine.checkpoint({ checkpoint_id: "p1", episode_ids: null, stop: false, controller_state: null });
    await engine.restore({ episode_ids: [{ rollout_id: "r2", attempt: 0 }] });
    expect(opSpan("restore").attributes[ID]).toBe("p1");
    await engine.retire({ episode_ids: [{ rollout_id: "r2", attempt: 1 }] });
    expect(opSpan("retire").attributes[ID]).toBe("p1");
    await engine.resume({ checkpoint_id: "p1" });

    for (const span of exporter.getFinishedSpans()) expect(["LATEST", "retire", "forget"]).not.toContain(span.attributes[ID]);
    for (const line of lines) expect(["LATEST", "retire", "forget"]).not.toContain(line.checkpoint_id);
  });

  it("a stage or .all span where a participant failed is ERROR and names the failing codes; a clean one is not", async () => {
    exporter.reset();
    await mkdir(join(root, "stage-failures"));
    const { engine, fake } = makeEngine(join(root, "stage-failures"));
    const last = (name: string) => exporter.getFinishedSpans().filter((s) => s.name === name).at(-1)!;
    // Prepare: model refuses; environment's stage went through.
    fake.set("model", "m1", "prepare", { error: "invalid_phase" });
    await expect(engine.prepare({ checkpoint_id: "f1" })).resolves.toMatchObject({ prepared: false });
    expect(last("checkpoint.coordinate.prepare.stage.environment").status.code).not.toBe(SpanStatusCode.ERROR);
    const model = last("checkpoint.coordinate.prepare.stage.model");
    expect(model.status.code).toBe(SpanStatusCode.ERROR);
    expect(model.attributes[SPAN_ATTR.codes]).toEqual(["invalid_phase"]);
    expect(model.events.map((e) => e.attributes)).toEqual([{ [SPAN_ATTR.kind]: "model", [SPAN_ATTR.instance]: "m1", [SPAN_ATTR.code]: "invalid_phase" }]);
    await engine.resume({ checkpoint_id: "f1" });

    // Commit's fan-out: one participant unreachable.
    fake.set("model", "m1", "prepare", "ok");
    await engine.prepare({ checkpoint_id: "f2" });
    fake.set("agent", "a1", "commit", "unreachable");
    await expect(engine.commit({ checkpoint_id: "f2", episode_ids: null, stop: false })).rejects.toBeDefined();
    const commitAll = last("checkpoint.coordinate.commit.all");
    expect(commitAll.status.code).toBe(SpanStatusCode.ERROR);
    expect(commitAll.attributes[SPAN_ATTR.codes]).toEqual(["unreachable"]);

    // Resume goes on past failures: its failing stage is ERROR, the others are not.
    fake.set("agent", "a1", "resume", { error: "internal_error" });
    await engine.resume({ checkpoint_id: "f2" }).catch(() => undefined);
    expect(last("checkpoint.coordinate.resume.stage.agent").status.code).toBe(SpanStatusCode.ERROR);
    expect(last("checkpoint.coordinate.resume.stage.agent").attributes[SPAN_ATTR.codes]).toEqual(["internal_error"]);
    expect(last("checkpoint.coordinate.resume.stage.model").status.code).not.toBe(SpanStatusCode.ERROR);
  });

  it("injects W3C traceparent and the bearer token into the NATS headers", async () => {
    let captured: MsgHdrs | undefined;
    const nc = echoNatsConnection((headers) => (captured = headers));
    const span = trace.getTracer("test").startSpan("parent");
    await new NatsParticipantTransport(nc).request("s", "{}", { timeoutMs: 100, token: "tok", context: trace.setSpan(context.active(), span) });
    span.end();
    expect(captured?.get("Authorization")).toBe("Bearer tok");
    const traceparent = captured?.get("traceparent");
    expect(traceparent).toMatch(new RegExp(`^00-${span.spanContext().traceId}-${span.spanContext().spanId}-0[01]$`));
  });
});
