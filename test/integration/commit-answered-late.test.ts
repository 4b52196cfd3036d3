import { existsSync } from "node:fs";
import { join } from "node:path";
import { Kvm } from "@nats-io/kv";
import { describe, expect, it } from "vitest";
import { journalBucket } from "../../protocol/index.js";
import { monitorPhaseMessages, worldWithLeader } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";

const world = worldWithLeader();

describe("a participant whose commit answers only after the op's deadline", () => {
  it("the checkpoint op answers the participant's deadline_exceeded, publishes nothing, withdraws its decision and leaves nobody parked", async () => {
    const late = world().participant("agent1");
    let release!: () => void;
    late.adapter.delay("exportRecords", new Promise<void>((resolve) => (release = resolve)));
    const monitor = monitorPhaseMessages(world().pnc, world().deployment);
    await world().pnc.flush();
    // Released once the abort's resume reached it: it commits late, then resumes.
    const releasing = waitUntil(() => monitor.log.some((m) => m.op === "resume" && m.target === "agent/agent1"), "the abort's resume sent to agent1", 20_000).then(() => release());
    const error = await refusalOf(world().client.checkpoint({ checkpoint_id: "late-commit", deadline_ts: Date.now() / 1000 + 3 }));
    await releasing;
    monitor.stop();
    // The participant gives up its commit at the deadline and says so (the controller's retry is refused: it resumed).
    expect(error.code).toBe("deadline_exceeded");
    expect(error.message).toContain("agent/agent1");
    expect(existsSync(join(world().root, "LATEST"))).toBe(false);
    expect(existsSync(join(world().root, "late-commit", "checkpoint.json"))).toBe(false);
    await waitUntil(() => world().participants.every((p) => p.handle.controlPlane.currentPhase === "idle"), "every participant resumed", 10_000);
    // The decision was withdrawn and the checkpoint closed: no entry left for a successor to complete.
    const kv = await new Kvm(world().pnc).open(journalBucket(world().deployment));
    await waitUntil(async () => (await kv.get("late-commit"))?.operation !== "PUT", "the journal entry removed", 10_000);
  }, 60_000);
});
