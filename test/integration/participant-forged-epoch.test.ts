import { describe, expect, it } from "vitest";
import { controlRequest, phase } from "../support/control-requests.js";
import { DEFAULT_MEMBERS, PARTICIPANT_TOKEN, worldWithLeader } from "./coordinator-harness.js";

// A holder of the participants' token forging an epoch above the sitting leader's: admitted, it
// would fence that leader out of every participant it reached (at 2^53 - 1, every leader for good).
// Each participant asks the leader lease whether that epoch was ever issued before raising its fence.
const world = worldWithLeader();

describe("a phase message forged with an epoch the leader lease never issued", () => {
  it("is refused invalid_request and raises no fence: the leader's checkpoints go on", async () => {
    const target = { deployment: world().deployment, kind: "agent" as const, instance: "agent1", token: PARTICIPANT_TOKEN };
    const leaderEpoch = world().coordinators[0]!.lease.state().epoch!;
    for (const epoch of [Number.MAX_SAFE_INTEGER, leaderEpoch + 1]) {
      const reply = await controlRequest(world().pnc, target, "prepare", phase(`forged-${epoch}`, { epoch }));
      expect(reply).toMatchObject({ error: { code: "invalid_request", detail: expect.stringContaining("above every epoch the leader lease has issued") } });
      // A status probe carrying it is answered, its fence unmoved.
      expect(await controlRequest(world().pnc, target, "status", { epoch })).toMatchObject({ phase: "idle", epoch: leaderEpoch });
    }
    expect(world().participant("agent1").handle.controlPlane.currentPhase).toBe("idle");
    const reply = await world().client.checkpoint({ checkpoint_id: "after-forgery" });
    expect(reply.participants).toBe(DEFAULT_MEMBERS.length);
  }, 30_000);
});
