import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Collector, type CollectorController } from "../../../coordinator/collect/collector.js";
import { CheckpointError } from "../../../protocol/index.js";

const exporter = new InMemorySpanExporter();
let dir: string;
beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-otel-"));
});
afterAll(async () => {
  trace.disable();
  context.disable();
  await rm(dir, { recursive: true, force: true });
});

describe("collector spans", () => {
  it("checkpoint.collection.checkpoint names its checkpoint id and the error code when the checkpoint fails", async () => {
    const prepared: string[] = [];
    const controller = {
      prepare: async (req: { checkpoint_id: string }) => {
        prepared.push(req.checkpoint_id);
        throw new CheckpointError("not_leader", "no coordinator serves");
      },
      resume: async () => ({}),
      list: async () => ({ latest: null, checkpoints: [] }),
      status: async () => ({ checkpoint: null, participants: [] }),
    } as unknown as CollectorController;
    const collector = new Collector({ rows: [], runUrl: "http://127.0.0.1:1/run", outPath: join(dir, "results.jsonl"), checkpointDir: dir, controller, logger: pino({ level: "silent" }) });
    await collector.start(); // its log records the checkpoint before the prepare
    await expect(collector.checkpoint({ stop: false })).rejects.toMatchObject({ code: "not_leader" });
    const span = exporter.getFinishedSpans().find((s) => s.name === "checkpoint.collection.checkpoint")!;
    expect(span.status.code).toBe(2); // ERROR
    expect(span.attributes["gym_ckpt.error.code"]).toBe("not_leader");
    expect(prepared).toHaveLength(1);
    expect(span.attributes["gym_ckpt.checkpoint.id"]).toBe(prepared[0]);
  });
});
