import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { MemoryDecisionJournal } from "../../../coordinator/ha/decision-journal.js";
import { FakeParticipants, TestClock, makeEngine, writers } from "./fake-participants.js";

/**
 * A new leader asks the registered participants which epoch they have seen (the daemon's epoch
 * floor, see LeaderLease.campaign) while the key it just created runs: the answer must come within
 * the bound it gives, whatever a stalled participant's request timeout would be.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-epoch-floor-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/** TestClock's instants, with timers that fire (the bound is a timer). */
class FiringClock extends TestClock {
  override setTimer(fn: () => void, ms: number): () => void {
    const timer = setTimeout(fn, ms);
    return () => clearTimeout(timer);
  }
}

const MEMBERS = [
  { kind: "environment" as const, instance: "e1" },
  { kind: "model" as const, instance: "m1" },
  { kind: "agent" as const, instance: "a1" },
  { kind: "resources" as const, instance: "r1" },
];

describe("the highest epoch participants have seen", () => {
  it("is the highest any status within the bound reports; a stalled one (its request would wait seconds of slack) does not hold it up", async () => {
    const fake = new FakeParticipants(MEMBERS);
    fake.set("environment", "e1", "status", { epoch: 12 });
    fake.set("model", "m1", "status", { epoch: 40 });
    fake.set("agent", "a1", "status", "hang");
    fake.set("resources", "r1", "status", "unreachable");
    const { engine } = makeEngine(root, { members: MEMBERS, successorOf: { fake, journal: new MemoryDecisionJournal(), clock: new FiringClock() } });
    expect(await engine.highestEpochSeen(100)).toBe(40);
    // A status carries no epoch of the coordinator's: asking raises nothing at the participants.
    expect(fake.ops("status").map((c) => c.body)).toEqual([{}, {}, {}, {}]);
  });

  it("leaves out an epoch no lease revision can pass (2^53 - 1, the most a status may carry): it would make the lease ignore the whole floor, the others' epochs and the published one too", async () => {
    const fake = new FakeParticipants(MEMBERS);
    fake.set("environment", "e1", "status", { epoch: Number.MAX_SAFE_INTEGER });
    fake.set("model", "m1", "status", { epoch: 40 });
    const { engine } = makeEngine(root, { members: MEMBERS, successorOf: { fake, journal: new MemoryDecisionJournal(), clock: new FiringClock() } });
    // Before: 2^53 - 1, a floor the lease ignores (epoch_floor_out_of_range_ignored), so the new
    // leader took a revision below 40 and the model refused it (stale_epoch).
    expect(await engine.highestEpochSeen(100)).toBe(40);
  });

  it("is 0 when nobody answers (no participant registered, or all stalled)", async () => {
    const fake = new FakeParticipants(MEMBERS);
    for (const m of MEMBERS) fake.set(m.kind, m.instance, "status", "hang");
    const { engine } = makeEngine(root, { members: MEMBERS, successorOf: { fake, journal: new MemoryDecisionJournal(), clock: new FiringClock() } });
    expect(await engine.highestEpochSeen(50)).toBe(0);
    const none = makeEngine(root, { members: [], successorOf: { fake: new FakeParticipants([]), journal: new MemoryDecisionJournal(), clock: new FiringClock() } });
    expect(await none.engine.highestEpochSeen(50)).toBe(0);
  });
});
