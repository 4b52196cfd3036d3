import { describe, expect, it } from "vitest";
import { openMembersBucket } from "../../coordinator/membership/members-bucket.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";
import { worldWithLeader } from "./coordinator-harness.js";

const world = worldWithLeader();

/** What a participant of a newer protocol might announce: fields version 1 lacks, and its version. */
const V2_ANNOUNCEMENT = { kind: "agent", instance: "agent9", incarnation: "i-v2", started_at: 1, heartbeat_at: 1, protocol_version: 2, capabilities: ["streaming"] };

// Before: the coordinator skipped this entry (logging membership_entry_invalid only), and the
// checkpoint prepared, committed and published without agent9; its rollouts were not captured.
describe("a membership entry of another protocol version", () => {
  it("blocks the checkpoint (nothing published) and shows in status, naming its key and both versions; once deleted, the checkpoint goes through", async () => {
    const kv = await openMembersBucket(world().pnc, world().deployment);
    const revision = await kv.put("agent.agent9", JSON.stringify(V2_ANNOUNCEMENT));
    const leader = world().coordinators[0]!;
    const applied = () => (leader.members as unknown as { lastRevision: number }).lastRevision;
    await waitUntil(() => applied() >= revision, "the leader's watch to deliver the entry", 5000);

    const refused = await refusalOf(world().client.checkpoint({ checkpoint_id: "with-v2" }));
    expect(refused.code).toBe("prepare_incomplete");
    expect(refused.message).toMatch(/agent\/agent9: unreachable \(agent\/agent9 cannot be addressed: membership entry agent\.agent9 speaks protocol version 2 \(a newer gym-ckpt\); this one speaks protocol version 1 only/);
    expect((await world().client.list()).checkpoints).toEqual([]);
    // Nobody is left parked: the abort resumed whoever the prepare reached.
    await waitUntil(async () => (await world().client.status()).checkpoint === null, "the aborted checkpoint closed", 5000);

    const status = await world().client.status();
    expect(status.participants.find((p) => p.instance === "agent9")).toMatchObject({
      kind: "agent",
      reachable: false,
      phase: null,
      error: { code: "unreachable", detail: expect.stringMatching(/membership entry agent\.agent9 speaks protocol version 2/) },
    });

    await kv.delete("agent.agent9"); // a delete marker is a delete
    await waitUntil(async () => !(await world().client.status()).participants.some((p) => p.instance === "agent9"), "the entry's removal in the leader's view", 5000);
    const published = await world().client.checkpoint({ checkpoint_id: "without-v2" });
    expect(published.participants).toBe(5);
  });
});
