import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { encodeLeaseValue, leaseIssuedEpoch } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { refusalOf } from "../../support/refusal.js";

// A message forged with the participants' token must not raise the epoch fence above the sitting
// leader's: at 2^53 - 1 no leader could ever be admitted again.
const T0 = 1_700_000_000;
const ISSUED = 7;

let root: string;
let plane: ParticipantControlPlane;
let asked: number[];

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-epoch-issued-"));
  asked = [];
  plane = new ParticipantControlPlane({
    adapter: new ScriptableKind("agent"),
    instance: "a1",
    clock: new ManualClock(T0 * 1000),
    checkpointRoot: root,
    epochFloor: 5,
    epochIssued: async (epoch) => (asked.push(epoch), epoch <= ISSUED),
  });
});
afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

const prepare = (checkpoint_id: string, epoch: number) => plane.handle("prepare", { checkpoint_id, deadline_ts: T0 + 30, epoch });
const resume = (checkpoint_id: string, epoch: number) => plane.handle("resume", { checkpoint_id, deadline_ts: T0 + 30, epoch });

describe("an epoch the leader lease never issued", () => {
  it("is refused invalid_request with nothing changed: the leader's own epoch is still admitted after it", async () => {
    const forged = await refusalOf(prepare("forged", Number.MAX_SAFE_INTEGER));
    expect(forged.code).toBe("invalid_request");
    expect(forged.message).toContain(`epoch ${Number.MAX_SAFE_INTEGER} is above every epoch the leader lease has issued`);
    expect(plane.currentPhase).toBe("idle");
    expect((await plane.handle("status", {})).epoch).toBe(5);
    expect((await prepare("c1", ISSUED)).phase).toBe("prepared");
    await resume("c1", ISSUED);
    expect((await plane.handle("status", {})).epoch).toBe(ISSUED);
  });

  it("carried by a status probe is answered but not raised to", async () => {
    expect((await plane.handle("status", { epoch: 1_000_000 })).epoch).toBe(5);
    expect((await plane.handle("status", { epoch: 6 })).epoch).toBe(6);
  });

  it("is asked about only above what was seen or confirmed: once per new epoch", async () => {
    await plane.handle("status", { epoch: 4 }); // below the floor: nothing to ask
    await prepare("c2", 6);
    await resume("c2", 6);
    await prepare("c3", 6);
    await resume("c3", 6);
    expect(asked).toEqual([6]);
  });
});

describe("leaseIssuedEpoch", () => {
  const value = (epoch: number | null) => encodeLeaseValue({ id: "c", term: "t", serving: true, epoch, at: 0 });
  it("is the epoch the key names, its create's revision while it names none, else the last sequence", () => {
    expect(leaseIssuedEpoch(40, { revision: 40, value: value(9) })).toBe(9);
    expect(leaseIssuedEpoch(12, { revision: 12, value: value(null) })).toBe(12);
    expect(leaseIssuedEpoch(33, null)).toBe(33);
    expect(leaseIssuedEpoch(0, null)).toBe(0);
    // An older coordinator's value names no epoch: nothing can be told.
    expect(leaseIssuedEpoch(12, { revision: 12, value: JSON.stringify({ id: "old" }) })).toBeUndefined();
  });
});
