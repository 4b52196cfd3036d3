import { readdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { GYM_SERVERS, TASK, startGymWorld, type GymWorld } from "../support/gym-processes.js";
import { ep } from "../support/episode.js";

/**
 * The reference Gym end to end: nats-server, coordinator, policy backend, model attach proxy,
 * resources, agent and environment as real processes. Crashes are SIGKILL of every Gym process
 * except the inference backend, whose call log is the ground truth for "no delivered call repeated".
 */
let world: GymWorld;

beforeAll(async () => {
  world = await startGymWorld();
}, 60_000);
afterAll(async () => {
  await world?.close();
});
beforeEach(async () => {
  await world.backend.reset();
});

/** [capture_key, message_count] of every backend call of a rollout, in order. */
async function callsOf(rollout: string): Promise<[string | null, number][]> {
  return (await world.backend.calls())
    .filter((c) => c.capture_key === rollout || c.capture_key?.startsWith(`${rollout}-a`))
    .map((c) => [c.capture_key, c.message_count]);
}

/** Starts `/run`s and waits until `total` backend calls arrived (the held ones included). */
async function startHeld(rollouts: string[], total: number, via: "environment" | "agent" = "environment") {
  const runs = rollouts.map((r) => world.run(r, 0, TASK, via).catch((error: unknown) => ({ status: 0, body: { lost: String(error) } })));
  await world.waitFor(async () => (await world.backend.calls()).length >= total, `${total} backend calls`);
  return runs;
}

async function expectIdleEverywhere(): Promise<void> {
  for (const name of GYM_SERVERS) {
    const status = await world.status(name);
    expect({ name, phase: status.phase, retired: status.retired_rollouts }).toEqual({ name, phase: "idle", retired: 0 });
  }
  expect(await world.state("environment")).toMatchObject({ episodes: 0, restored_pending: 0 });
  expect(await world.state("agent")).toMatchObject({ sessions: 0, legacy_episodes: 0, restored_pending: 0 });
}

describe("reference Gym: crash and restore", () => {
  it("continues a native episode from its last boundary after SIGKILL of every Gym process ([2,4,4])", async () => {
    await world.backend.hold(1);
    const [lost] = await startHeld(["native-1"], 2);
    await world.checkpointNoResume("cp-native-1", [ep("native-1")]);
    expect((await world.verify("cp-native-1")).records).toBeGreaterThanOrEqual(3);
    await world.crashAndRestart("cp-native-1");
    await world.backend.release();
    expect((await lost)!.status).not.toBe(200);
    await world.restoreAndResume("cp-native-1", [ep("native-1")]);
    const replacement = await world.run("native-1", 1);
    expect(replacement.body).toEqual({ rollout_id: "native-1", attempt: 1, reward: 1, answer: "42", continued_from: "invoke_agent" });
    expect(await callsOf("native-1")).toEqual([
      ["native-1", 2],
      ["native-1", 4],
      ["native-1-a1", 4],
    ]);
    const calls = (await world.backend.calls()).filter((c) => c.capture_key?.startsWith("native-1"));
    expect(calls.map((c) => c.delivered)).toEqual([true, false, true]);
    await world.client.forget({ rollout_ids: ["native-1"] });
    await expectIdleEverywhere();
  });

  it("the legacy /run path continues after a crash", async () => {
    await world.backend.hold(1);
    const [lost] = await startHeld(["legacy-1"], 2, "agent");
    await world.checkpointNoResume("cp-legacy-1", [ep("legacy-1")]);
    await world.crashAndRestart("cp-legacy-1");
    await world.backend.release();
    await lost;
    await world.restoreAndResume("cp-legacy-1", [ep("legacy-1")]);
    const replacement = await world.run("legacy-1", 1, TASK, "agent");
    expect(replacement.body).toEqual({ rollout_id: "legacy-1", attempt: 1, reward: 1, answer: "42", continued_from: "loop" });
    expect(await callsOf("legacy-1")).toEqual([
      ["legacy-1", 2],
      ["legacy-1", 4],
      ["legacy-1-a1", 4],
    ]);
    await world.client.forget({ rollout_ids: ["legacy-1"] });
  });

  it("a checkpoint without a crash parks and then releases: the response is held, no second call is made", async () => {
    await world.backend.hold(1);
    const [run] = await startHeld(["park-1"], 2);
    const prepared = await world.client.prepare({ checkpoint_id: "cp-park-1" });
    expect(prepared.prepared).toBe(true);
    // The generation finishes while prepared; the proxy holds its response until resume.
    await world.backend.release();
    await world.waitFor(async () => (await world.backend.calls()).filter((c) => c.capture_key === "park-1").every((c) => c.finished), "the held generation to finish");
    const agent = await world.state("agent");
    expect(agent.states).toMatchObject({ at_boundary: 1, running: 0 });
    await world.client.commit({ checkpoint_id: "cp-park-1", episode_ids: [ep("park-1")] });
    await world.client.publish({ checkpoint_id: "cp-park-1" });
    await world.client.resume({ checkpoint_id: "cp-park-1" });
    expect((await run)!.body).toMatchObject({ reward: 1, attempt: 0 });
    expect(await callsOf("park-1")).toEqual([
      ["park-1", 2],
      ["park-1", 4],
    ]);
    await world.verify("cp-park-1");
    await expectIdleEverywhere();
  });

  it("a retired episode stops everywhere and leaves nothing behind", async () => {
    await world.backend.hold(1);
    const [run] = await startHeld(["retire-1"], 2);
    await world.client.retire({ episode_ids: [ep("retire-1")] });
    const result = await run;
    expect(result!.status).toBe(409);
    expect(result!.body.error.code).toBe("stale_attempt");
    await world.backend.release();
    for (const name of GYM_SERVERS) {
      const status = await world.status(name);
      expect({ name, retired: status.retired_rollouts, blockers: status.report.blocker_count }).toEqual({ name, retired: 1, blockers: 0 });
    }
    expect(await world.state("environment")).toMatchObject({ episodes: 0 });
    expect(await world.state("agent")).toMatchObject({ sessions: 0 });
    // Requests of the retired attempt are refused everywhere until forget.
    expect((await world.run("retire-1", 0)).body.error.code).toBe("stale_attempt");
    expect((await world.run("retire-1", 0, TASK, "agent")).body.error.code).toBe("stale_attempt");
    expect(await callsOf("retire-1")).toHaveLength(2);
    await world.client.forget({ rollout_ids: ["retire-1"] });
    await expectIdleEverywhere();
    // Re-dispatched as the next attempt, it runs from its input.
    expect((await world.run("retire-1", 1)).body).toMatchObject({ reward: 1, continued_from: null });
  });

  it("16 concurrent episodes all continue after a crash, and the call log proves no delivered call is repeated", async () => {
    const rollouts = Array.from({ length: 16 }, (_, i) => `many-${i}`);
    await world.backend.hold(16);
    const finished = new Map<string, any>();
    const runs = rollouts.map((r) => world.run(r).then((result) => finished.set(r, result.body), () => undefined));
    // Calls beyond the 16th are held: each episode either finished within them or waits on exactly one held call.
    const held = async () => new Set((await world.backend.calls()).filter((c) => c.seq > 16).map((c) => c.capture_key));
    await world.waitFor(async () => finished.size + (await held()).size === 16, "every episode finished or held", 30_000);
    const inFlight = rollouts.filter((r) => !finished.has(r));
    expect(inFlight.length).toBeGreaterThan(0);
    await world.checkpointNoResume("cp-many", inFlight.map((r) => ep(r)));
    await world.crashAndRestart("cp-many");
    await world.backend.release();
    await Promise.all(runs);
    await world.restoreAndResume("cp-many", inFlight.map((r) => ep(r)));
    const replacements = await Promise.all(inFlight.map((r) => world.run(r, 1)));
    expect(replacements.map((r) => [r.body.reward, r.body.continued_from])).toEqual(inFlight.map(() => [1, "invoke_agent"]));
    expect([...finished.values()].map((b) => b.reward)).toEqual(rollouts.filter((r) => finished.has(r)).map(() => 1));
    const calls = await world.backend.calls();
    // Every episode needs 2 calls; each crashed one re-issues exactly its one undelivered call.
    expect(calls.length).toBe(32 + inFlight.length);
    for (const r of inFlight) {
      const own = calls.filter((c) => c.capture_key === r);
      const next = calls.filter((c) => c.capture_key === `${r}-a1`);
      expect(own.map((c) => c.delivered)).toEqual([...own.slice(0, -1).map(() => true), false]);
      // the replacement starts with the undelivered call: same conversation length, never a delivered one again
      expect(next[0]!.message_count).toBe(own.at(-1)!.message_count);
      expect(own.length + next.length).toBe(3);
    }
    await world.client.forget({ rollout_ids: rollouts });
    await expectIdleEverywhere();
  }, 90_000);

  it("bad input: task-digest mismatch, attempt conflicts and retired attempts are refused with documented codes, and nothing is lost", async () => {
    await world.backend.hold(1);
    const [lost] = await startHeld(["bad-1"], 2);
    // attempt conflict while attempt 0 runs
    expect((await world.run("bad-1", 1)).body.error.code).toBe("stale_attempt");
    await world.checkpointNoResume("cp-bad-1", [ep("bad-1")]);
    await world.crashAndRestart("cp-bad-1");
    await world.backend.release();
    await lost;
    await world.restoreAndResume("cp-bad-1", [ep("bad-1")]);
    // a different task for the restored attempt is refused and the restored record is kept
    const mismatch = await world.run("bad-1", 1, { expression: "1 + 1", tool_rounds: 1 });
    expect(mismatch).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect((await world.status("environment")).extras).toMatchObject({ restored_pending: 1 });
    // an unknown capture key at the agent
    const unknown = await fetch(`${world.gym.urls.agent}/ng-rollout/nobody-a3/activate`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ task: TASK }),
    });
    expect(unknown.status).toBe(400);
    expect(((await unknown.json()) as any).error.code).toBe("invalid_request");
    // the right task still continues from the boundary
    expect((await world.run("bad-1", 1)).body).toMatchObject({ reward: 1, continued_from: "invoke_agent" });
    expect(await callsOf("bad-1")).toEqual([
      ["bad-1", 2],
      ["bad-1", 4],
      ["bad-1-a1", 4],
    ]);
    await world.client.forget({ rollout_ids: ["bad-1"] });
  });

  it("corrupt restored records install nothing anywhere: the restore is refused before anything is sent, everyone stays idle, the rollout restarts from input", async () => {
    await world.backend.hold(1);
    const [lost] = await startHeld(["corrupt-1"], 2);
    await world.checkpointNoResume("cp-corrupt-1", [ep("corrupt-1")]);
    await world.crashAndRestart("cp-corrupt-1");
    await world.backend.release();
    await lost;
    const dir = join(new CheckpointCatalog(world.root).dirFor("cp-corrupt-1"), "gym", "environment", world.gym.instances.environment);
    const file = (await readdir(dir)).find((f) => f.startsWith("records-"))!;
    await writeFile(join(dir, file), (await readFile(join(dir, file), "utf8")).replace("invoke_agent", "invoke_agenX"));
    // The coordinator hashes every records file against its manifest before it sends a restore.
    await expect(world.client.restore({ checkpoint_id: "cp-corrupt-1", episode_ids: [ep("corrupt-1")] })).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    for (const name of GYM_SERVERS) expect((await world.status(name)).phase).toBe("idle");
    expect(await world.state("environment")).toMatchObject({ episodes: 0, restored_pending: 0 });
    expect(await world.state("agent")).toMatchObject({ sessions: 0, restored_pending: 0 });
    // Nothing was installed, so nothing was retired: attempt+1 runs from input
    expect((await world.run("corrupt-1", 1)).body).toMatchObject({ reward: 1, continued_from: null });
    await world.client.forget({ rollout_ids: ["corrupt-1"] });
    await expectIdleEverywhere();
  });
});

/**
 * A restart_only resources server: its seed reply says `x-ng-checkpoint-restart: 1`, so the
 * environment marks the episode a restart; prepare reports it, the commit scope must leave it out,
 * and after a crash the rollout restarts from its input.
 */
describe("reference Gym with a restart_only resources server", () => {
  let restartWorld: GymWorld;
  beforeAll(async () => {
    restartWorld = await startGymWorld({ args: { resources: ["--mode", "restart_only"] } });
  }, 60_000);
  afterAll(async () => {
    await restartWorld?.close();
  });

  it("reports the episode as a restart, keeps it out of the checkpoint, and restarts it from input after a crash", async () => {
    const w = restartWorld;
    await w.backend.hold(1);
    const lost = w.run("ro-1").catch((error: unknown) => ({ status: 0, body: { lost: String(error) } }));
    await w.waitFor(async () => (await w.backend.calls()).length >= 2, "2 backend calls");
    const prepared = await w.client.prepare({ checkpoint_id: "cp-ro-1" });
    expect(prepared.prepared).toBe(true);
    expect(prepared.restarts).toEqual(["ro-1"]);
    // The resources server lists its live session; the environment marked the episode from the seed header.
    const restartsOf = (kind: string) => prepared.participants.find((p) => p.kind === kind)?.report?.restarts;
    expect({ environment: restartsOf("environment"), resources: restartsOf("resources") }).toEqual({ environment: ["ro-1"], resources: ["ro-1"] });
    // A scope naming a restart is refused; the scope without it commits.
    await expect(w.client.commit({ checkpoint_id: "cp-ro-1", episode_ids: [ep("ro-1")] })).rejects.toMatchObject({ code: "restart_in_scope" });
    await w.client.commit({ checkpoint_id: "cp-ro-1", episode_ids: [] });
    await w.client.publish({ checkpoint_id: "cp-ro-1" });
    const manifest = await new CheckpointCatalog(w.root).get("cp-ro-1");
    expect({ scope: manifest.scope, restarts: manifest.restarts }).toEqual({ scope: [], restarts: ["ro-1"] });
    expect((await w.verify("cp-ro-1")).records).toBe(0);

    await w.crashAndRestart("cp-ro-1");
    await w.backend.release();
    expect((await lost).status).not.toBe(200);
    await w.restoreAndResume("cp-ro-1", []);
    const replacement = await w.run("ro-1", 1);
    expect(replacement.body).toMatchObject({ rollout_id: "ro-1", attempt: 1, reward: 1, continued_from: null });
    const calls = (await w.backend.calls()).filter((c) => c.capture_key?.startsWith("ro-1")).map((c) => [c.capture_key, c.message_count]);
    // From input again: the replacement repeats the first call.
    expect(calls).toEqual([
      ["ro-1", 2],
      ["ro-1", 4],
      ["ro-1-a1", 2],
      ["ro-1-a1", 4],
    ]);
    await w.client.forget({ rollout_ids: ["ro-1"] });
  }, 60_000);
});
