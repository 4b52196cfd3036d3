import { afterEach, beforeEach, expect, it } from "vitest";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";

/**
 * Every prepare sets the lease to max(current, deadline + grace), also a retry answered from the
 * kept `prepared` reply: a controller polling `prepare` with the same id (stopped at a later stage)
 * sends every stage again with a new deadline, and the stages already prepared answer from their
 * kept reply. Without the renewal, a small `--lease-grace-seconds` lets their lease expire under
 * that new prepare: they resume (the id fenced) and the commit after it is refused.
 */

const T0 = 1_700_000_000;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(() => {
  clock = new ManualClock(T0 * 1000);
  kind = new ScriptableKind("environment");
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 5 });
});

afterEach(() => plane.dispose());

const flush = async () => {
  for (let i = 0; i < 10; i++) await new Promise((resolve) => setImmediate(resolve));
};

it("a prepare retry answered from the kept reply renews the lease to its own deadline + grace, so it does not expire under that prepare", async () => {
  const prepare = (deadline: number) => plane.handle("prepare", { checkpoint_id: "c1", deadline_ts: deadline, epoch: 1 });
  expect((await prepare(T0 + 10)).phase).toBe("prepared"); // lease T0 + 15
  clock.advance(8_000);
  expect((await prepare(T0 + 40)).phase).toBe("prepared"); // from the kept reply
  expect(plane.status().lease_expires_at).toBe(T0 + 45);
  clock.advance(20_000); // T0 + 28: past the first prepare's lease, before the retry's deadline
  await flush();
  expect({ phase: plane.currentPhase, checkpoint: plane.activeCheckpointId, admissionOpen: kind.admissionOpen }).toEqual({
    phase: "prepared",
    checkpoint: "c1",
    admissionOpen: false,
  });
});

it("a prepare of a resumed id is still refused and extends no lease (its kept reply went with the resume)", async () => {
  const prepare = (deadline: number) => plane.handle("prepare", { checkpoint_id: "c1", deadline_ts: deadline, epoch: 1 });
  await prepare(T0 + 10);
  await plane.handle("resume", { checkpoint_id: "c1", deadline_ts: T0 + 10, epoch: 1 });
  await expect(prepare(T0 + 40)).rejects.toMatchObject({ code: "stale_checkpoint" });
  expect(plane.status().lease_expires_at).toBe(null);
});
