import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { CLOCK_SKEW_THRESHOLD_MS, CLOCK_SKEW_WARN_EVERY_MS } from "../../../participants/control-plane/clock-skew.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { useTelemetryProviders } from "../../../participants/telemetry/instruments.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";
import { refusalOf } from "../../support/refusal.js";

/**
 * Deadlines are absolute instants of the coordinator's clock, read on the participant's: a clock
 * ahead of the coordinator's refuses ops as already past their deadline. The coordinator's send
 * time (Gym-Sent-At) lets the participant say so, and log it; it never refuses anything itself.
 */
const T0 = 1_700_000_000_000; // ms; the participant's clock starts here
const PLAIN = "the deadline has already passed";
const { meterProvider, collect } = inMemoryMetrics();

let root: string;
let clock: ManualClock;
let lines: Record<string, unknown>[];
let plane: ParticipantControlPlane;

beforeAll(() => useTelemetryProviders({ meterProvider }));
afterAll(async () => {
  useTelemetryProviders({});
  await meterProvider.shutdown();
});
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-skew-"));
  clock = new ManualClock(T0);
  lines = [];
  const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
  plane = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env0", clock, leaseGraceSeconds: 60, checkpointRoot: root, logger });
});
afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

/** An op whose deadline lies `deadlineInS` ahead of the participant's clock, sent `sentAgoMs` ago by it (undefined: no header). */
function call<O extends PhaseOp>(op: O, deadlineInS: number, sentAgoMs: number | undefined, body: Partial<RequestInputOf<O>> = {}) {
  const request = { checkpoint_id: "c1", deadline_ts: clock.now() / 1000 + deadlineInS, epoch: 1, ...body };
  return plane.handle(op, request as never, undefined, sentAgoMs === undefined ? undefined : clock.now() - sentAgoMs);
}

const skewLines = () => lines.filter((l) => typeof l["msg"] === "string" && (l["msg"] as string).startsWith("clock_skew")).map(({ msg, level, offset_ms, op }) => ({ msg, level, offset_ms, op }));

describe("a deadline refused as already passed", () => {
  it("says nothing more without a send time (an older coordinator)", async () => {
    const refusal = await refusalOf(call("prepare", -5, undefined));
    expect(refusal).toMatchObject({ code: "deadline_exceeded", message: PLAIN });
    expect(skewLines()).toEqual([]);
  });

  it("names this clock's lead over the coordinator's when it exceeds the threshold", async () => {
    // Sent 42.1 s ago by this clock with a 30 s deadline (the coordinator's): this clock is 42.1 s ahead.
    const refusal = await refusalOf(call("prepare", 30 - 42.1, 42_100));
    expect(refusal.code).toBe("deadline_exceeded");
    expect(refusal.message).toBe(
      `${PLAIN}: this participant's clock reads 42.1 s ahead of the coordinator's (by the op's send time, network delay included); deadlines are absolute, so keep the hosts' clocks in sync (NTP, chrony)`,
    );
    expect(refusal.toReply().error.detail).toBe(refusal.message);
    expect(plane.currentPhase).toBe("idle"); // a refusal changes nothing
  });

  it("stays plain at the threshold (delivery delay) and explains just past it", async () => {
    expect((await refusalOf(call("prepare", -1, CLOCK_SKEW_THRESHOLD_MS))).message).toBe(PLAIN);
    expect((await refusalOf(call("prepare", -1, CLOCK_SKEW_THRESHOLD_MS + 1))).message).toMatch(/^the deadline has already passed: this participant's clock reads 1\.0 s ahead/);
  });

  it("stays plain when this clock is behind, or the deadline passed for another reason", async () => {
    expect((await refusalOf(call("prepare", -1, -120_000))).message).toBe(PLAIN);
    // Skewed, but the refusal is not about the deadline: left as it is.
    expect((await refusalOf(call("commit", 30, 120_000, { checkpoint_dir: join(root, "c1"), episode_ids: null, stop: false } as never))).code).toBe("invalid_phase");
  });

  it("names this clock's lag when a clock far behind (reset to 1970) refuses a deadline as past the cap", async () => {
    // The coordinator sent it 8 days ahead of this clock, with a 30 s deadline: by this clock it lies 8 days + 30 s ahead.
    const behindMs = 8 * 86_400_000;
    const refusal = await refusalOf(call("prepare", behindMs / 1000 + 30, -behindMs));
    expect(refusal.code).toBe("invalid_request");
    expect(refusal.message).toBe(
      `deadline_ts lies more than 604800 s ahead (seconds, not milliseconds): this participant's clock reads 691200.0 s behind the coordinator's (by the op's send time, network delay included); deadlines are absolute, so keep the hosts' clocks in sync (NTP, chrony)`,
    );
    // Without a send time (an older coordinator), or with clocks that agree (the deadline itself is wrong): as before.
    expect((await refusalOf(call("prepare", behindMs / 1000 + 30, undefined))).message).toBe("deadline_ts lies more than 604800 s ahead (seconds, not milliseconds)");
    expect((await refusalOf(call("prepare", behindMs / 1000 + 30, 0))).message).toBe("deadline_ts lies more than 604800 s ahead (seconds, not milliseconds)");
  });

  it("refuses nothing for the skew itself: an op in time succeeds whatever the send time", async () => {
    expect(await call("prepare", 30, 3_600_000)).toMatchObject({ phase: "prepared" });
    expect(await call("resume", 30, -3_600_000)).toEqual({ phase: "idle", idempotent: false });
  });
});

describe("the clock_skew log", () => {
  it("warns at most once a minute while skewed, and once when back within bounds", async () => {
    await call("renew", 30, 5_000).catch(() => undefined);
    clock.advance(CLOCK_SKEW_WARN_EVERY_MS - 1);
    await call("renew", 30, 5_000).catch(() => undefined); // within the minute: not again
    await plane.handle("status", {}, undefined, clock.now() - 7_000); // status ops are measured too
    clock.advance(1);
    await call("renew", 30, -5_000).catch(() => undefined); // a minute on: again (behind counts too)
    await call("resume", 30, 20); // back within bounds
    await call("resume", 30, 10); // still within: nothing more
    await call("resume", 30, 2_000); // skewed again: at once
    expect(skewLines()).toEqual([
      { msg: "clock_skew", level: 40, offset_ms: 5_000, op: "renew" },
      { msg: "clock_skew", level: 40, offset_ms: -5_000, op: "renew" },
      { msg: "clock_skew_cleared", level: 30, offset_ms: 20, op: "resume" },
      { msg: "clock_skew", level: 40, offset_ms: 2_000, op: "resume" },
    ]);
    expect(lines.find((l) => l["msg"] === "clock_skew")).toMatchObject({ epoch: 1, kind: "environment", instance: "env0" });
  });

  it("is the gauge gym_ckpt.participant.clock_offset (s), once an op said its send time", async () => {
    const offset = async () =>
      (await collect()).find((m) => m.descriptor.name === "gym_ckpt.participant.clock_offset")?.dataPoints.find((p) => p.attributes["participant"] === "env0");
    expect(await offset()).toBeUndefined();
    await call("resume", 30, 2_500);
    const point = await offset();
    expect(point?.value).toBe(2.5);
    expect(point?.attributes).toEqual({ kind: "environment", participant: "env0" });
  });
});
