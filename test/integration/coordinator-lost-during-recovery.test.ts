import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { LEADER_KEY } from "../../coordinator/ha/leader-lease.js";
import { leaderBucket, participantSubject } from "../../protocol/index.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("leadership lost while recovering", () => {
  it("the deposed coordinator does not subscribe the controller API when its recovery ends (it would take requests it never answers)", async () => {
    // A predecessor's entry naming a participant that takes requests and never answers: recovery's
    // resume of it runs until leadership is lost (each try is short).
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    await journal.record({
      checkpoint_id: "lost-rec-1",
      epoch: 1,
      state: "open",
      participants: [{ kind: "environment", instance: "silent" }],
      prepared_at: 1,
      checkpoint_dir: null,
      scope: null,
      stop: false,
      restarts: [],
      auto_publish: false,
      controller_state: null,
      updated_at: 1,
    });
    let resumeSeen = false;
    const silent = world.pnc.subscribe(participantSubject(world.deployment, "environment", "silent", "resume"), {
      callback: () => {
        resumeSeen = true;
      },
    });
    const settings = { ...NO_HTTP, lease_ms: 1000, default_timeout_ms: 4000, request_attempt_ms: 300, request_slack_ms: 0 };
    const a = await world.startCoordinator({ ...settings, coordinator_id: "coord-a" });
    expect(a.lease.state().leader).toBe(true);
    let recovering: Promise<unknown> | undefined;
    const recover = a.engine.recover.bind(a.engine);
    a.engine.recover = () => (recovering = recover());
    const b = await world.startCoordinator({ ...settings, coordinator_id: "coord-b" });
    await waitUntil(() => resumeSeen, "coord-a's recovery to send the resume", 5000);

    // A loses its lease mid-recovery; B takes it.
    const kv = await new Kvm(world.pnc).open(leaderBucket(world.deployment));
    await kv.purge(LEADER_KEY);
    expect(await b.lease.campaignNow()).toBe(true);
    await waitUntil(() => !a.lease.state().leader, "coord-a to demote", 5000);
    await recovering;
    await new Promise((resolve) => setImmediate(resolve)); // the daemon's continuation after recovery ran
    expect(a.lease.state().leader).toBe(false);
    expect(a.natsApi.serving).toBe(false);
    silent.unsubscribe();
  });
});
