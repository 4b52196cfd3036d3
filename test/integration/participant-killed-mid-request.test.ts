import type { NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { nobodyAnswers } from "../support/control-requests.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";
import { checkpointThenFreshProcesses, DEFAULT_MEMBERS, LoggedKind, NO_HTTP, startStalledProcess, startWorld, type StalledProcess, type World } from "./coordinator-harness.js";

// A Gym process SIGKILLed while the coordinator waits on its reply, then restarted by its
// supervisor: the new process announces itself, and the request to the dead one stops waiting at
// once instead of holding the op for the whole request_attempt_ms (set far above the waits here).
const ATTEMPT_MS = 30_000;
const AGENT = { kind: "agent" as const, instance: "agent1" };

let world: World;
const killed: StalledProcess<LoggedKind>[] = [];

beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants(DEFAULT_MEMBERS.filter((m) => m.instance !== AGENT.instance));
  await (await world.startCoordinator({ ...NO_HTTP, request_attempt_ms: ATTEMPT_MS })).whenReady();
});
afterAll(async () => {
  for (const k of killed) k.release();
  await Promise.allSettled(killed.map((k) => k.handle.stop()));
  await world?.close();
});

/** agent1 on a connection of its own (closing it is the SIGKILL), whose `hook` waits until released. */
async function startStalling(hook: "exportRecords" | "openAdmission" | "install"): Promise<StalledProcess<LoggedKind>> {
  const stalled = await startStalledProcess(world, new LoggedKind(AGENT.kind, AGENT.instance), hook);
  killed.push(stalled);
  return stalled;
}

/** Kills the stalled process (its subscriptions go with its connection) and starts its replacement. */
async function killAndRestart(nc: NatsConnection): Promise<void> {
  await nc.close();
  await waitUntil(() => nobodyAnswers(world.pnc, world.deployment, AGENT.kind, AGENT.instance), "the killed process's subscriptions gone");
  await world.startParticipants([AGENT]);
}

describe("a participant killed while the coordinator waits on its reply, then restarted", () => {
  it("its commit stops waiting once the new process announces itself: the checkpoint fails unreachable, well before request_attempt_ms, and the next one succeeds", async () => {
    const stalled = await startStalling("exportRecords");
    const started = Date.now();
    const checkpoint = refusalOf(world.client.checkpoint({ checkpoint_id: "killed-commit", deadline_ts: Date.now() / 1000 + 60 }));
    await waitUntil(() => stalled.adapter.hooks().includes("exportRecords"), "agent1's commit under way");
    await killAndRestart(stalled.nc);
    const error = await checkpoint;
    expect(error.code).toBe("unreachable");
    expect(error.message).toContain("agent/agent1 restarted after checkpoint killed-commit opened");
    expect(error.message).toContain("the request in flight to the old process was abandoned");
    expect(Date.now() - started).toBeLessThan(ATTEMPT_MS);
    await waitUntil(() => world.participants.every((p) => p.handle.controlPlane.currentPhase === "idle"), "everyone resumed");
    const next = await world.client.checkpoint({ checkpoint_id: "after-kill" });
    expect(next.participants).toBe(DEFAULT_MEMBERS.length);
  }, 60_000);

  it("its resume stops waiting once the new process announces itself and counts as done: the new process holds nothing of the checkpoint", async () => {
    // The restart above left a fresh agent1 in the world: replace it with one that stalls its resume.
    const fresh = world.participant(AGENT.instance);
    await fresh.handle.stop();
    world.participants.splice(world.participants.indexOf(fresh), 1);
    const stalled = await startStalling("openAdmission");
    await world.client.prepare({ checkpoint_id: "killed-resume" });
    const started = Date.now();
    const resume = world.client.resume({ checkpoint_id: "killed-resume" });
    await waitUntil(() => stalled.adapter.hooks().includes("openAdmission"), "agent1's resume under way");
    await killAndRestart(stalled.nc);
    const reply = await resume;
    expect(Date.now() - started).toBeLessThan(ATTEMPT_MS);
    expect(reply.participants.find((p) => p.instance === AGENT.instance)).toMatchObject({ kind: "agent", idempotent: true });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  }, 60_000);

  it("its restore (sent to whichever process is there) is sent again at once to the new process, which restores: the restore and its resume succeed", async () => {
    const episode = { rollout_id: "kr1", attempt: 0 };
    // A restore goes to fresh processes (after a crash): agent1's stalls installing.
    const stalled = await checkpointThenFreshProcesses(world, "killed-restore-base", episode, () => startStalling("install"));
    const started = Date.now();
    const restore = world.client.restore({ checkpoint_id: "killed-restore-base", episode_ids: [episode] });
    await waitUntil(() => stalled.adapter.hooks().includes("install"), "agent1's restore under way");
    await killAndRestart(stalled.nc);
    const reply = await restore;
    expect(Date.now() - started).toBeLessThan(ATTEMPT_MS);
    expect(reply.participants.find((p) => p.instance === AGENT.instance)?.restored).toEqual(["kr1-a1"]);
    expect(world.participant(AGENT.instance).adapter.restored.size).toBe(1);
    await world.client.resume({ checkpoint_id: "killed-restore-base" });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  }, 60_000);
});
