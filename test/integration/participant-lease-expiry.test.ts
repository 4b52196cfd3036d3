/**
 * Reference rule (participant lease): "if the controller that started a checkpoint stops calling,
 * the participant resumes on its own, which is the same as an abort": lease expiry reopens exactly
 * like a resume, fencing the id. Over a real nats-server: a participant whose lease ran out while
 * prepared refuses that checkpoint's commit (stale_checkpoint), so the coordinator publishes
 * nothing and releases the others, and the id stays fenced for a later prepare.
 */
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { startParticipant } from "../../participants/control-plane/start-participant.js";
import { DEFAULT_MEMBERS, LoggedKind, NO_HTTP, PARTICIPANT_TOKEN, hookLog, startWorld, type World } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";

const SHORT_GRACE_S = 1;

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants(DEFAULT_MEMBERS.filter((m) => m.instance !== "tools"));
  // The resources participant keeps a checkpoint only SHORT_GRACE_S past its last deadline.
  const adapter = new LoggedKind("resources", "tools");
  const handle = await startParticipant({
    nc: world.pnc,
    deployment: world.deployment,
    instance: "tools",
    token: PARTICIPANT_TOKEN,
    adapter,
    leaseGraceSeconds: SHORT_GRACE_S,
    logger: pino({ level: "silent" }),
  });
  world.participants.push({ kind: "resources", instance: "tools", adapter, handle });
  await (await world.startCoordinator(NO_HTTP)).whenReady();
});
afterAll(async () => {
  await world?.close();
});

describe("a participant lease that expires while a checkpoint is prepared", () => {
  it("aborts that checkpoint at the participant: its commit is refused stale_checkpoint, nothing is published, the controller's resume releases the others, the id stays fenced", async () => {
    const tools = world.participant("tools");
    const prepared = await world.client.prepare({ checkpoint_id: "lease-1", deadline_ts: Date.now() / 1000 + 3 });
    expect(prepared.prepared).toBe(true);
    hookLog.length = 0;
    // Nobody renews: the lease (deadline + grace) runs out and the participant resumes by itself.
    await waitUntil(() => tools.handle.controlPlane.currentPhase === "idle", "the lease to expire at resources/tools", 20_000);
    expect(hookLog).toContain("open:resources/tools");
    expect(tools.handle.controlPlane.status().checkpoint_id).toBeNull();
    for (const p of world.participants) if (p !== tools) expect(p.handle.controlPlane.currentPhase).toBe("prepared");

    const error = await refusalOf(world.client.commit({ checkpoint_id: "lease-1" }));
    expect(error.message).toContain("resources/tools");
    expect(error.message).toContain("stale_checkpoint");
    expect(tools.adapter.hooks()).not.toContain("exportRecords");
    expect(await new CheckpointCatalog(world.root).latest()).toBeNull();
    // The fine-grained commit leaves the abort to its controller (reference: the controller resumes
    // explicitly); that resume releases the others, and the expired participant answers it as done.
    await world.client.resume({ checkpoint_id: "lease-1" });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    // Expiry fenced the id like a resume: a delayed or retried prepare of it cannot park the participant again.
    expect((await refusalOf(world.client.prepare({ checkpoint_id: "lease-1" }))).code).toBe("stale_checkpoint");
    expect(tools.handle.controlPlane.currentPhase).toBe("idle");
  });
});
