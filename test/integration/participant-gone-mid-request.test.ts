import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ABSENT_PROBES } from "../../coordinator/engine/presence-probe.js";
import { nobodyAnswers } from "../support/control-requests.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";
import { checkpointThenFreshProcesses, DEFAULT_MEMBERS, LoggedKind, NO_HTTP, startStalledProcess, startWorld, type StalledProcess, type World } from "./coordinator-harness.js";

// A Gym process that dies while the coordinator waits on its reply, with no supervisor to start
// it again: the presence probes find nothing subscribed to its subjects and the try ends then,
// not when request_attempt_ms (set far above the waits here) runs out. A process that is only
// slow keeps answering the probes and is waited for.
const ATTEMPT_MS = 30_000;
const PROBE_MS = 200;
const AGENT = { kind: "agent" as const, instance: "agent1" };

/** Counts the status requests it answers: the coordinator's presence probes. */
class ProbedKind extends LoggedKind {
  probes = 0;
  override statusExtras(): Record<string, unknown> {
    this.probes++;
    return super.statusExtras();
  }
}

let world: World;
const started: StalledProcess<ProbedKind>[] = [];

beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants(DEFAULT_MEMBERS.filter((m) => m.instance !== AGENT.instance));
  await (await world.startCoordinator({ ...NO_HTTP, request_attempt_ms: ATTEMPT_MS, request_probe_ms: PROBE_MS })).whenReady();
});
afterAll(async () => {
  for (const s of started) s.release();
  await Promise.allSettled(started.map((s) => s.handle.stop()));
  await world?.close();
});

/** agent1 on a connection of its own (closing it is the SIGKILL), whose `hook` (default: its commit's export) waits until released. */
async function startStalling(hook: "exportRecords" | "install" = "exportRecords"): Promise<StalledProcess<ProbedKind>> {
  const stalled = await startStalledProcess(world, new ProbedKind(AGENT.kind, AGENT.instance), hook);
  started.push(stalled);
  return stalled;
}

describe("presence probes while a try waits on a participant", () => {
  it("a slow participant answers them and is waited for: its commit, released after more probes than it takes to give up, completes the checkpoint", async () => {
    const slow = await startStalling();
    const checkpoint = world.client.checkpoint({ checkpoint_id: "slow-commit", deadline_ts: Date.now() / 1000 + 60 });
    await waitUntil(() => slow.adapter.hooks().includes("exportRecords"), "agent1's commit under way");
    await waitUntil(() => slow.adapter.probes > ABSENT_PROBES, "more probes answered than would end the try");
    slow.release();
    const reply = await checkpoint;
    expect(reply.participants).toBe(DEFAULT_MEMBERS.length);
    const probes = slow.adapter.probes;
    // The probes stop with the try: none after the reply (a few probe periods later).
    await new Promise((resolve) => setTimeout(resolve, 3 * PROBE_MS));
    expect(slow.adapter.probes).toBe(probes);
    await slow.handle.stop();
    started.length = 0;
  }, 60_000);

  it("a participant gone from NATS mid-commit with no replacement ends the try after the probes find it gone: outcome_unknown naming it, well before request_attempt_ms; the others resumed", async () => {
    const dying = await startStalling();
    const begun = Date.now();
    const checkpoint = refusalOf(world.client.checkpoint({ checkpoint_id: "gone-commit", deadline_ts: Date.now() / 1000 + 60 }));
    await waitUntil(() => dying.adapter.hooks().includes("exportRecords"), "agent1's commit under way");
    await dying.nc.close();
    await waitUntil(() => nobodyAnswers(world.pnc, world.deployment, AGENT.kind, AGENT.instance), "the dead process's subscriptions gone");
    const error = await checkpoint;
    expect(error.code).toBe("outcome_unknown");
    expect(error.message).toContain(`agent/agent1 left NATS while the try waited (no responders on its status subject in ${ABSENT_PROBES} probes ${PROBE_MS} ms apart)`);
    expect(error.message).toContain("the earlier try may have acted");
    expect(Date.now() - begun).toBeLessThan(ATTEMPT_MS / 2);
    await waitUntil(() => world.participants.every((p) => p.handle.controlPlane.currentPhase === "idle"), "the others resumed");
    // Its supervisor brings it back later: the next checkpoint includes the new process.
    dying.release();
    await world.startParticipants([AGENT]);
    const coordinator = world.coordinators[0]!;
    const fresh = world.participant(AGENT.instance);
    await waitUntil(() => coordinator.members.incarnationOf(AGENT) === fresh.handle.controlPlane.incarnation, "the new agent1 in the view");
    const next = await world.client.checkpoint({ checkpoint_id: "after-gone" });
    expect(next.participants).toBe(DEFAULT_MEMBERS.length);
  }, 60_000);

  it("a restore (any process of the name may answer it) is not probed: one whose process died waits for the replacement, which restores, even when it comes after the probes would have given up", async () => {
    const episode = { rollout_id: "gr1", attempt: 0 };
    // A restore goes to fresh processes (after a crash): agent1's stalls installing, then dies.
    const dying = await checkpointThenFreshProcesses(world, "gone-restore-base", episode, () => startStalling("install"));
    const restore = world.client.restore({ checkpoint_id: "gone-restore-base", episode_ids: [episode] });
    await waitUntil(() => dying.adapter.hooks().includes("install"), "agent1's restore under way");
    await dying.nc.close();
    await waitUntil(() => nobodyAnswers(world.pnc, world.deployment, AGENT.kind, AGENT.instance), "the dead process's subscriptions gone");
    // The supervisor's restart takes longer than the probes of a guarded op would wait.
    await new Promise((resolve) => setTimeout(resolve, (ABSENT_PROBES + 2) * PROBE_MS));
    expect(dying.adapter.probes).toBe(0);
    await world.startParticipants([AGENT]);
    const reply = await restore;
    expect(reply.participants.find((p) => p.instance === AGENT.instance)?.restored).toEqual(["gr1-a1"]);
    expect(world.participant(AGENT.instance).adapter.restored.size).toBe(1);
    await world.client.resume({ checkpoint_id: "gone-restore-base" });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  }, 60_000);
});
