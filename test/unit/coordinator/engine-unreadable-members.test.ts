import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { UnreadableMember } from "../../../coordinator/membership/member-registry.js";
import { refusalOf } from "../../support/refusal.js";
import { makeEngine, writers } from "./fake-participants.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-engine-unreadable-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const V2_AGENT: UnreadableMember = {
  key: "agent.a9",
  participant: { kind: "agent", instance: "a9" },
  reason: "membership entry agent.a9 speaks protocol version 2 (a newer gym-ckpt); this one speaks protocol version 1 only: run coordinators and participants of one protocol version",
};
const KEYLESS: UnreadableMember = { key: "verifier.v1", participant: undefined, reason: "membership entry verifier.v1 is not a protocol version 1 announcement (kind: Invalid option)" };

function engineWith(unreadable: UnreadableMember[], members?: NonNullable<Parameters<typeof makeEngine>[1]>["members"]) {
  const made = makeEngine(root, members ? { members } : {});
  Object.assign(made.membership, { unreadable: async () => unreadable });
  return made;
}

// Before: the registry skipped such an entry, so the engine never heard of it and the checkpoint
// published without that participant (its rollouts not captured, nobody told).
describe("a membership entry the coordinator cannot read", () => {
  it("is a blocker of its stage: the checkpoint stops there (unreachable, naming the key and why), aborts and publishes nothing", async () => {
    const { engine, fake, catalog } = engineWith([V2_AGENT]);
    const refused = await refusalOf(engine.checkpoint({ checkpoint_id: "c1", episode_ids: null, stop: false, controller_state: null }));
    expect(refused.code).toBe("prepare_incomplete");
    expect(refused.message).toMatch(/stage agent not prepared: agent\/a9: unreachable \(agent\/a9 cannot be addressed: membership entry agent\.a9 speaks protocol version 2/);
    expect(fake.ops("prepare").map((c) => c.kind)).not.toContain("resources"); // stopped at its stage
    expect(fake.ops("prepare").map((c) => c.instance)).not.toContain("a9"); // never sent anything
    expect(fake.ops("commit")).toEqual([]);
    expect(await catalog.latest()).toBeNull();
    expect(engine.openCheckpoint).toBeNull();
  });

  it("prepare reports it among the blockers with its code and detail", async () => {
    const { engine } = engineWith([V2_AGENT]);
    const reply = await engine.prepare({ checkpoint_id: "c2" });
    expect(reply.prepared).toBe(false);
    expect(reply.stopped_at).toEqual(["agent"]);
    expect(reply.blockers).toContainEqual({ kind: "agent", instance: "a9", blockers: [], blocker_count: 0, code: "unreachable" });
    expect(reply.participants.find((p) => p.instance === "a9")?.error?.detail).toMatch(/membership entry agent\.a9 speaks protocol version 2/);
    await engine.resume({ checkpoint_id: "c2" });
  });

  it("one whose key names no participant refuses prepare before anything is opened or sent", async () => {
    const { engine, fake, journal } = engineWith([KEYLESS]);
    const refused = await refusalOf(engine.prepare({ checkpoint_id: "c3" }));
    expect(refused.code).toBe("unreachable");
    expect(refused.message).toMatch(/prepare of checkpoint c3 refused, nothing sent: .*membership entry verifier\.v1 is not a protocol version 1 announcement/);
    expect(fake.calls).toEqual([]);
    expect(journal.entries.size).toBe(0);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("status lists it as not reachable, with the key and why", async () => {
    const { engine } = engineWith([V2_AGENT, KEYLESS]);
    const status = await engine.status();
    expect(status.participants.find((p) => p.instance === "a9")).toMatchObject({ kind: "agent", reachable: false, phase: null, error: { code: "unreachable", detail: expect.stringMatching(/membership entry agent\.a9 speaks protocol version 2/) } });
    // In member-key order; the entry whose key names no participant has no row to show (logged by the registry).
    expect(status.participants.map((p) => `${p.kind}/${p.instance}`)).toEqual(["agent/a1", "agent/a2", "agent/a9", "environment/e1", "model/m1", "resources/r1"]);
  });

  it("refuses a restore before anything is journaled or sent", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    const { engine, fake, journal } = engineWith([V2_AGENT]);
    const refused = await refusalOf(engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(refused.code).toBe("unreachable");
    expect(refused.message).toMatch(/restore of checkpoint base refused, nothing sent: .*membership entry agent\.a9 speaks protocol version 2/);
    expect(fake.ops("restore")).toEqual([]);
    expect(journal.entries.size).toBe(0);
  });

  it("retire outside a checkpoint stops at its stage (the fence must reach it)", async () => {
    const { engine, fake } = engineWith([V2_AGENT]);
    const refused = await refusalOf(engine.retire({ episode_ids: [{ rollout_id: "r9", attempt: 0 }] }));
    expect(refused.code).toBe("unreachable");
    expect(refused.message).toMatch(/agent\/a9/);
    expect(fake.ops("retire").map((c) => c.kind)).not.toContain("model");
  });

  it("retire and forget with no readable member are refused unreachable naming it, not not_found ('no participants')", async () => {
    for (const unreadable of [V2_AGENT, KEYLESS]) {
      const { engine, fake } = engineWith([unreadable], []);
      const retire = await refusalOf(engine.retire({ episode_ids: [{ rollout_id: "r9", attempt: 0 }] }));
      expect(retire.code).toBe("unreachable");
      expect(retire.message).toContain(unreadable.key);
      const forget = await refusalOf(engine.forget({ rollout_ids: ["r9"] }));
      expect(forget.code).toBe("unreachable");
      expect(fake.calls).toEqual([]);
    }
  });
});
