import { metrics, SpanStatusCode, trace } from "@opentelemetry/api";
import type { HistogramMetricData } from "@opentelemetry/sdk-metrics";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { afterAll, describe, expect, it } from "vitest";
import { ParticipantClient } from "../../../coordinator/engine/participant-client.js";
import { SPAN_ATTR } from "../../../coordinator/telemetry/coordinator-telemetry.js";
import type { TransportRequestOptions } from "../../../coordinator/engine/transport.js";
import { CheckpointError } from "../../../protocol/index.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";
import { TestClock } from "./fake-participants.js";

// Registered before the first coordinatorTelemetry() call of this (forked) test file.
const { meterProvider, collect } = inMemoryMetrics();
metrics.setGlobalMeterProvider(meterProvider);
const spans = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] }));
afterAll(async () => {
  trace.disable();
  metrics.disable();
  await meterProvider.shutdown();
});

const resume = (clock: TestClock) => ({ checkpoint_id: "c1", deadline_ts: clock.now() / 1000 + 5, epoch: 1 });

describe("a participant call's outcome, span and duration", () => {
  // CallOptions.guard: "throwing (e.g. not_leader) ends the call with that code": an outcome, never
  // a rejection (a fan-out awaits every member's outcome with Promise.all).
  it("a guard that throws ends the call as a failed outcome with the guard's code, its span ERROR with that code", async () => {
    spans.reset();
    const clock = new TestClock();
    const transport = { request: async () => '{"phase":"idle","idempotent":false}' };
    const client = new ParticipantClient({ transport, deployment: "d", token: "t", clock, slackMs: 100 });
    const guard = () => {
      throw new CheckpointError("not_leader", "deposed");
    };
    const outcome = await client.call({ kind: "model", instance: "m1" }, "resume", resume(clock), clock.now() + 5000, { guard });
    expect(outcome).toEqual({ ok: false, participant: { kind: "model", instance: "m1" }, code: "not_leader", detail: "deposed" });
    const [span] = spans.getFinishedSpans().filter((s) => s.name === "checkpoint.participant.resume");
    expect(span?.status).toEqual({ code: SpanStatusCode.ERROR, message: "deposed" });
    expect(span?.attributes[SPAN_ATTR.code]).toBe("not_leader");
  });

  it("a successful call's span is not ERROR, and its duration is recorded in seconds by op, kind and outcome", async () => {
    spans.reset();
    const clock = new TestClock();
    // The reply comes 1.5 s (monotonic) after the request.
    const transport = { request: async () => ((clock.current += 1500), '{"phase":"idle","idempotent":false}') };
    const client = new ParticipantClient({ transport, deployment: "d", token: "t", clock, slackMs: 100 });
    const outcome = await client.call({ kind: "agent", instance: "a1" }, "resume", resume(clock), clock.now() + 5000);
    expect(outcome.ok).toBe(true);
    const [span] = spans.getFinishedSpans().filter((s) => s.name === "checkpoint.participant.resume");
    expect(span?.status.code).toBe(SpanStatusCode.UNSET);
    expect(span?.attributes[SPAN_ATTR.code]).toBeUndefined();
    const histogram = (await collect()).find((m) => m.descriptor.name === "gym_ckpt.coordinator.request.duration") as HistogramMetricData;
    const point = histogram.dataPoints.find((p) => p.attributes.kind === "agent");
    expect(point?.attributes).toEqual({ op: "resume", kind: "agent", outcome: "ok" });
    expect([point?.value.count, point?.value.sum]).toEqual([1, 1.5]);
  });
});

/** TestClock whose timers the test fires by hand. */
class TimerClock extends TestClock {
  readonly timers = new Set<() => void>();
  override setTimer(fn: () => void): () => void {
    const timer = () => fn();
    this.timers.add(timer);
    return () => void this.timers.delete(timer);
  }
  fire(): void {
    const due = [...this.timers];
    this.timers.clear();
    for (const timer of due) timer();
  }
}
const flush = () => new Promise((resolve) => setImmediate(resolve));

describe("a participant call's tries", () => {
  // The request timeout is "the time left until the deadline plus slack": slack alone once it passed.
  it("waits the time left plus slack, and slack alone past the deadline", async () => {
    const clock = new TestClock();
    const timeouts: number[] = [];
    const transport = { request: async (_s: string, _b: string, o: TransportRequestOptions) => (timeouts.push(o.timeoutMs), '{"phase":"idle","idempotent":false}') };
    const client = new ParticipantClient({ transport, deployment: "d", token: "t", clock, slackMs: 100 });
    await client.call({ kind: "agent", instance: "a1" }, "resume", resume(clock), clock.now() + 2000);
    await client.call({ kind: "agent", instance: "a1" }, "resume", resume(clock), clock.now() - 2000);
    expect(timeouts).toEqual([2100, 100]);
  });

  // Presence probes run only for a call that asks for them (probePresence), only while its try
  // waits: none are left running once the reply came.
  it("probes the participant's status subject only when asked, and stops probing when the try ends", async () => {
    for (const asked of [false, true]) {
      const clock = new TimerClock();
      const subjects: string[] = [];
      let reply!: (text: string) => void;
      const transport = {
        request: (subject: string) => {
          subjects.push(subject);
          return subject.endsWith(".status") ? Promise.resolve("{}") : new Promise<string>((resolve) => (reply = resolve));
        },
      };
      const client = new ParticipantClient({ transport, deployment: "d", token: "t", clock, slackMs: 100, presenceProbeMs: 50 });
      const call = client.call({ kind: "agent", instance: "a1" }, "resume", resume(clock), clock.now() + 5000, { probePresence: asked });
      for (let i = 0; i < 3; i++) {
        clock.fire();
        await flush();
      }
      expect(subjects.filter((s) => s.endsWith(".status")).length, `probed when asked: ${asked}`).toBe(asked ? 3 : 0);
      reply('{"phase":"idle","idempotent":false}');
      expect((await call).ok).toBe(true);
      expect(clock.timers.size, "timers left once the try ended").toBe(0);
    }
  });

  it("reads a reply that is JSON null as an invalid reply (internal_error), not a crash", async () => {
    const clock = new TestClock();
    const client = new ParticipantClient({ transport: { request: async () => "null" }, deployment: "d", token: "t", clock, slackMs: 100 });
    const outcome = await client.call({ kind: "agent", instance: "a1" }, "resume", resume(clock), clock.now() + 2000);
    expect(outcome).toMatchObject({ ok: false, code: "internal_error", detail: expect.stringContaining("invalid resume reply") });
  });
});
