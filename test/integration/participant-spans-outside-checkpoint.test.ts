import { context } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { useTelemetryProviders } from "../../participants/telemetry/instruments.js";
import { startWorld, type World } from "./coordinator-harness.js";

/**
 * docs/telemetry.md, Spans: a retire or forget outside any checkpoint names no checkpoint id, on
 * the coordinator's span and on the participants' `checkpoint.retire` / `checkpoint.forget` spans
 * alike. The wire's required `checkpoint_id` then holds a placeholder (the op's name), which must
 * not show up as a checkpoint called "retire" or "forget" in searches by `gym_ckpt.checkpoint.id`.
 */
const spans = new InMemorySpanExporter();
const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] });
let world: World;

beforeAll(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  useTelemetryProviders({ tracerProvider });
  world = await startWorld();
  await world.startParticipants([
    { kind: "environment", instance: "env1" },
    { kind: "model", instance: "policy" },
  ]);
  await world.startCoordinator();
  await world.coordinators[0]!.whenReady();
}, 30_000);

afterAll(async () => {
  await world?.close();
  useTelemetryProviders({});
  context.disable();
});

describe("participant retire/forget spans outside a checkpoint", () => {
  it("carry no checkpoint id (as the coordinator's op span), not the op's name", async () => {
    await world.client.retire({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await world.client.forget({ rollout_ids: ["r1"] });
    const ops = spans.getFinishedSpans().filter((s) => s.name === "checkpoint.retire" || s.name === "checkpoint.forget");
    expect(ops.length).toBe(4);
    expect(ops.map((s) => `${s.name}: ${String(s.attributes["gym_ckpt.checkpoint.id"])}`)).toEqual(ops.map((s) => `${s.name}: undefined`));
  }, 30_000);
});
