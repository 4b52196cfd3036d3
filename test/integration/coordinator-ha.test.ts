import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ParticipantClient } from "../../coordinator/engine/participant-client.js";
import { NatsParticipantTransport } from "../../coordinator/engine/nats-transport.js";
import { systemClock } from "../../coordinator/engine/clock.js";
import { LEADER_KEY } from "../../coordinator/ha/leader-lease.js";
import { leaderBucket } from "../../protocol/index.js";
import { PARTICIPANT_TOKEN, monitorPhaseMessages, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("two coordinators: one lease, fenced epochs", () => {
  it("only the leader sends phase messages; the loser stops when it loses the lease; participants refuse its stale epoch", async () => {
    const monitor = monitorPhaseMessages(world.pnc, world.deployment);
    const a = await world.startCoordinator({ coordinator_id: "coord-a", lease_ms: 1500, http: { enabled: false, host: "127.0.0.1", port: 0 } });
    await a.whenReady();
    const b = await world.startCoordinator({ coordinator_id: "coord-b", lease_ms: 1500, http: { enabled: false, host: "127.0.0.1", port: 0 } });
    expect(a.lease.state()).toMatchObject({ leader: true, ready: true });
    expect(b.lease.state()).toMatchObject({ leader: false, ready: false });
    const epochA = a.lease.state().epoch!;

    const first = await world.client.checkpoint({ checkpoint_id: "ha-1" });
    expect(first.epoch).toBe(epochA);
    // the follower refuses to act
    await expect(b.engine.prepare({ checkpoint_id: "ha-x" })).rejects.toMatchObject({ code: "not_leader" });

    // A loses its lease (its key is taken away, as after a partition longer than the lease); B campaigns at once.
    const kv = await new Kvm(world.pnc).open(leaderBucket(world.deployment));
    await kv.purge(LEADER_KEY);
    expect(await b.lease.campaignNow()).toBe(true);
    const epochB = b.lease.state().epoch!;
    expect(epochB).toBeGreaterThan(epochA);
    // B waits one lease period before it sends anything: checked at once, not after A's demotion
    // below, which a loaded machine may stretch past that period
    expect(b.lease.state().ready).toBe(false);
    await expect(b.engine.prepare({ checkpoint_id: "ha-2" })).rejects.toMatchObject({ code: "not_leader" });
    // A notices at its next renewal and demotes; it then sends nothing
    await waitUntil(() => !a.lease.state().leader, "coord-a to demote", 5000);
    expect(a.natsApi.serving).toBe(false);
    const sentByA = monitor.log.filter((m) => m.epoch === epochA).length;
    await expect(a.engine.prepare({ checkpoint_id: "ha-2" })).rejects.toMatchObject({ code: "not_leader" });
    await b.whenReady();
    const second = await world.client.checkpoint({ checkpoint_id: "ha-2" });
    expect(second.epoch).toBe(epochB);
    // ha-1's reply lost, its retry reaches B: A removed ha-1's journal entry once everyone resumed,
    // so B answers from ha-1's checkpoint.json, sending nothing.
    const sentBefore = monitor.log.length;
    expect(await world.client.checkpoint({ checkpoint_id: "ha-1" })).toEqual({ ...first, deleted: [], resume_failures: [], timings_ms: { prepare: 0, commit: 0, publish: 0, resume: 0 } });
    expect(monitor.log.length).toBe(sentBefore);
    expect(monitor.log.filter((m) => m.epoch === epochA).length).toBe(sentByA);
    // every message of epoch A precedes every message of epoch B
    const lastA = monitor.log.map((m) => m.epoch === epochA).lastIndexOf(true);
    const firstB = monitor.log.findIndex((m) => m.epoch === epochB);
    expect(lastA).toBeLessThan(firstB);
    expect(monitor.log.every((m) => m.epoch === epochA || m.epoch === epochB)).toBe(true);

    // a delayed message of the deposed epoch is refused by every participant
    const raw = new ParticipantClient({ transport: new NatsParticipantTransport(world.pnc), deployment: world.deployment, token: PARTICIPANT_TOKEN, clock: systemClock, slackMs: 1000 });
    for (const p of world.participants) {
      const outcome = await raw.call(p, "prepare", { checkpoint_id: "ha-stale", deadline_ts: Date.now() / 1000 + 5, epoch: epochA }, Date.now() + 5000);
      expect(outcome).toMatchObject({ ok: false, code: "stale_epoch" });
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
    }
    monitor.stop();
    // A keeps campaigning as a follower and never wins while B renews: observed over three of B's
    // renewals (each one moves the key's revision on; A's campaigns in between all fail)
    const renewals = await kv.watch({ key: LEADER_KEY, include: "updates" });
    let seen = 0;
    for await (const entry of renewals) {
      expect(entry.operation).toBe("PUT");
      expect(a.lease.state().leader).toBe(false);
      if (++seen === 3) break;
    }
    renewals.stop();
    expect(a.lease.state().leader).toBe(false);
    expect(b.lease.state()).toMatchObject({ leader: true, ready: true, epoch: epochB });
  });
});
