import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { headers } from "@nats-io/transport-node";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { verifyCheckpoint } from "../../coordinator/publication/verify-checkpoint.js";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { openMembersBucket } from "../../coordinator/membership/members-bucket.js";
import { PROTOCOL_VERSION, controllerSubject, type Kind } from "../../protocol/index.js";
import { KIND_OF, PARTICIPANT_TOKEN, hookLog, monitorPhaseMessages, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";
import { controlRequest } from "../support/control-requests.js";
import { refusalOf } from "../support/refusal.js";

const PREPARE_RANK: Record<Kind, number> = { environment: 0, model: 1, agent: 2, resources: 3 };
const RESUME_RANK: Record<Kind, number> = { resources: 0, agent: 1, model: 2, environment: 3 };
const RETIRE_RANK: Record<Kind, number> = { environment: 0, agent: 1, model: 2, resources: 2 };

function expectStaged(entries: string[], rank: Record<Kind, number>): void {
  const ranks = entries.map((e) => rank[e.split(":")[1]!.split("/")[0] as Kind]);
  expect(ranks).toEqual([...ranks].sort((a, b) => a - b));
}

const refusal = refusalOf;

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  const coordinator = await world.startCoordinator();
  await coordinator.whenReady();
});
afterAll(async () => {
  await world?.close();
});
beforeEach(() => {
  hookLog.length = 0;
});

/** Until the coordinator's membership view shows every running participant's own incarnation. */
async function viewShowsEveryone(): Promise<void> {
  const coordinator = world.coordinators[0]!;
  await waitUntil(
    () => world.participants.every((p) => coordinator.members.incarnationOf({ kind: p.kind, instance: p.instance }) === p.handle.controlPlane.incarnation),
    "the coordinator to see every participant's incarnation",
    5000,
  );
}

describe("coordinator over a real nats-server with participants of all four kinds", () => {
  it("runs a full checkpoint in protocol order and publishes a verifiable checkpoint", async () => {
    world.participant("policy").adapter.addEpisode({ rollout_id: "r1", attempt: 0 }, { tokens: [1, 2] });
    world.participant("agent1").adapter.addEpisode({ rollout_id: "r1", attempt: 0 }, { turn: 2 });
    world.participant("env1").adapter.addEpisode({ rollout_id: "r1", attempt: 0 }, { step: 1 });
    const monitor = monitorPhaseMessages(world.pnc, world.deployment);
    await world.pnc.flush();
    const reply = await world.client.checkpoint({ checkpoint_id: "full-1", controller_state: { inline: { trainer_step: 10 } } });
    monitor.stop();
    expect(reply.participants).toBe(5);
    // messages on the wire: prepare staged, then commit to all, then resume reversed
    const ops = monitor.log.map((m) => m.op);
    expect(ops.slice(0, 5)).toEqual(Array(5).fill("prepare"));
    expect(ops.slice(5, 10)).toEqual(Array(5).fill("commit"));
    expect(ops.slice(10, 15)).toEqual(Array(5).fill("resume"));
    const prepareKinds = monitor.log.slice(0, 5).map((m) => PREPARE_RANK[KIND_OF(m.target)]);
    expect(prepareKinds).toEqual([...prepareKinds].sort());
    const resumeKinds = monitor.log.slice(10).map((m) => RESUME_RANK[KIND_OF(m.target)]);
    expect(resumeKinds).toEqual([...resumeKinds].sort());
    // what the participants did, in order
    const closes = hookLog.filter((h) => h.startsWith("close:"));
    const opens = hookLog.filter((h) => h.startsWith("open:"));
    expectStaged(closes, PREPARE_RANK);
    expectStaged(opens, RESUME_RANK);
    expect(hookLog.lastIndexOf(closes.at(-1)!)).toBeLessThan(hookLog.indexOf(hookLog.find((h) => h.startsWith("export:"))!));
    expect(Math.max(...hookLog.map((h, i) => (h.startsWith("export:") ? i : -1)))).toBeLessThan(hookLog.indexOf(opens[0]!));
    const epochs = new Set(monitor.log.map((m) => m.epoch));
    expect(epochs.size).toBe(1);
    // published and verifiable
    const catalog = new CheckpointCatalog(world.root);
    expect(await catalog.latest()).toBe("full-1");
    const verified = await verifyCheckpoint(catalog, "full-1");
    expect(verified.records).toBe(3);
    const manifest = (await world.client.get("full-1")).manifest;
    expect(manifest.controller_state).toEqual({ inline: { trainer_step: 10 } });
    expect(manifest.epoch).toBe([...epochs][0]);
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    const list = await world.client.list();
    expect(list.latest).toBe("full-1");
  });

  it("returns per-participant blockers at the deadline and stops at that stage", async () => {
    world.participant("policy").adapter.setBlockers(["r5", "r6-a1"]);
    try {
      const reply = await world.client.prepare({ checkpoint_id: "blocked-1", deadline_ts: Date.now() / 1000 + 1.5 });
      expect(reply.prepared).toBe(false);
      expect(reply.stopped_at).toEqual(["model"]);
      expect(reply.blockers).toEqual([{ kind: "model", instance: "policy", blockers: ["r5", "r6-a1"], blocker_count: 2, code: null }]);
      expect(hookLog.filter((h) => h.startsWith("close:"))).toEqual(["close:environment/env1", "close:model/policy"]);
      const status = await world.client.status();
      expect(status.checkpoint).toMatchObject({ checkpoint_id: "blocked-1", phase: "preparing" });
      expect(status.participants.find((p) => p.instance === "policy")).toMatchObject({ phase: "preparing", blocker_count: 2 });
      // commit refused in the wrong phase, nothing changed
      expect((await refusal(world.client.commit({ checkpoint_id: "blocked-1" }))).code).toBe("invalid_phase");
      expect(world.participant("policy").handle.controlPlane.currentPhase).toBe("preparing");
    } finally {
      world.participant("policy").adapter.setBlockers([]);
      await world.client.resume({ checkpoint_id: "blocked-1" });
    }
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });

  it("a commit the filesystem refuses at one participant (its directory cannot exist there: ENOTDIR, for root too) fails the checkpoint as storage_error naming it; nothing is published, everyone resumes", async () => {
    const catalog = new CheckpointCatalog(world.root);
    const latest = await catalog.latest();
    const env = world.participant("env1");
    const dir = join(world.root, "disk-1");
    // By the time env1 writes, `<dir>/gym/environment` is a regular file (as a checkpoint root not
    // mounted where it should be): its mkdir of `environment/env1` fails; the others' do not.
    const exportRecords = env.adapter.exportRecords.bind(env.adapter);
    env.adapter.exportRecords = async (scope) => {
      await mkdir(join(dir, "gym"), { recursive: true });
      await writeFile(join(dir, "gym", "environment"), "not a directory\n");
      return exportRecords(scope);
    };
    let error: Awaited<ReturnType<typeof refusal>>;
    try {
      error = await refusal(world.client.checkpoint({ checkpoint_id: "disk-1" }));
    } finally {
      delete (env.adapter as Partial<typeof env.adapter>).exportRecords; // the class's method again
    }
    expect([error.code, error.message]).toEqual([
      "storage_error",
      `commit failed on 1 participant(s): environment/env1: storage_error; first details: environment/env1: ENOTDIR: not a directory, mkdir '${join(dir, "gym", "environment", "env1")}'`,
    ]);
    expect(existsSync(join(dir, "checkpoint.json"))).toBe(false);
    expect(await catalog.latest()).toBe(latest);
    expect((await world.client.list()).checkpoints.map((c) => c.checkpoint_id)).not.toContain("disk-1");
    for (const p of world.participants) expect(`${p.instance}:${p.handle.controlPlane.currentPhase}`).toBe(`${p.instance}:idle`);
    // The storage fixed, the next checkpoint goes through.
    expect((await world.client.checkpoint({ checkpoint_id: "disk-2" })).participants).toBe(5);
  });

  it("a null-scope commit is refused before the decision when a participant requires a scope: nobody commits, the scoped retry does", async () => {
    world.participant("policy").adapter.scopeRequired = true;
    try {
      const prepared = await world.client.prepare({ checkpoint_id: "scoped-1" });
      expect(prepared.participants.find((p) => p.instance === "policy")?.report?.scope_required).toBe(true);
      const refused = await refusal(world.client.commit({ checkpoint_id: "scoped-1" }));
      expect(refused.code).toBe("invalid_request");
      expect(refused.message).toContain("model/policy");
      expect(hookLog.some((h) => h.startsWith("export:"))).toBe(false);
      for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("prepared");
      const committed = await world.client.commit({ checkpoint_id: "scoped-1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
      expect(committed.participants).toHaveLength(world.participants.length);
      await world.client.resume({ checkpoint_id: "scoped-1" });
    } finally {
      world.participant("policy").adapter.scopeRequired = false;
    }
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });

  it("reports an unreachable participant at once (no responders)", async () => {
    const kv = await openMembersBucket(world.pnc, world.deployment);
    const now = Date.now() / 1000;
    await kv.put("resources.ghost", JSON.stringify({ kind: "resources", instance: "ghost", incarnation: "x", started_at: now, heartbeat_at: now, protocol_version: PROTOCOL_VERSION }));
    try {
      // The coordinator's membership view follows the bucket through a watch: wait until it lists the ghost.
      await waitUntil(async () => (await world.client.status()).participants.some((p) => p.instance === "ghost"), "the ghost in the membership view");
      const started = Date.now();
      const reply = await world.client.prepare({ checkpoint_id: "ghost-1", deadline_ts: Date.now() / 1000 + 20 });
      expect(Date.now() - started).toBeLessThan(5000);
      expect(reply.prepared).toBe(false);
      expect(reply.blockers).toEqual([{ kind: "resources", instance: "ghost", blockers: [], blocker_count: 0, code: "unreachable" }]);
      const error = await refusal(world.client.resume({ checkpoint_id: "ghost-1" }));
      expect(error.code).toBe("unreachable");
      expect(error.message).toContain("resources/ghost");
      const status = await world.client.status();
      expect(status.participants.find((p) => p.instance === "ghost")).toMatchObject({ reachable: false, error: { code: "unreachable" } });
    } finally {
      await kv.delete("resources.ghost");
      // Gone from the view too, before the next test prepares.
      await waitUntil(async () => !(await world.client.status()).participants.some((p) => p.instance === "ghost"), "the ghost to leave the membership view");
    }
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });

  it("answers bad controller input with catalog codes and changes nothing", async () => {
    const nc = world.pnc;
    const ask = async (op: string, body: string, token = "controller-token") => {
      const h = headers();
      h.set("Authorization", `Bearer ${token}`);
      const msg = await nc.request(controllerSubject(world.deployment, op), body, { timeout: 5000, headers: h });
      return (msg.json() as { error?: { code: string } }).error?.code;
    };
    expect(await ask("prepare", JSON.stringify({ checkpoint_id: "x", bogus: 1 }))).toBe("invalid_request");
    expect(await ask("prepare", JSON.stringify({ checkpoint_id: 5 }))).toBe("invalid_request");
    expect(await ask("prepare", "{not json")).toBe("invalid_request");
    expect(await ask("prepare", JSON.stringify({ checkpoint_id: "../etc" }))).toBe("invalid_request");
    expect(await ask("commit", JSON.stringify({ checkpoint_id: "never-prepared" }))).toBe("not_found");
    expect(await ask("publish", JSON.stringify({ checkpoint_id: "never-prepared" }))).toBe("not_found");
    expect(await ask("get", JSON.stringify({ checkpoint_id: "missing" }))).toBe("not_found");
    expect(await ask("retire", JSON.stringify({ episode_ids: [] }))).toBe("invalid_request");
    expect(await ask("status", "{}", "wrong-token")).toBe("unauthorized");
    expect(await ask("checkpoint", JSON.stringify({ deadline_ts: 1 }))).toBe("deadline_exceeded");
    // the same id cannot be reused after publication
    expect(await ask("prepare", JSON.stringify({ checkpoint_id: "full-1" }))).toBe("stale_checkpoint");
    expect(hookLog).toEqual([]);
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });

  it("the checkpoint op refuses a controller state file it could not publish before sending anything, so the id stays usable", async () => {
    const state = '{"trainer_step":7}\n';
    const monitor = monitorPhaseMessages(world.pnc, world.deployment);
    await world.pnc.flush();
    expect(await refusal(world.client.checkpoint({ checkpoint_id: "state-file-1", controller_state: { file: "trainer.json" } }))).toMatchObject({
      code: "not_found",
      // the id and the path, so the controller knows where to put it and which id to retry
      message: expect.stringContaining(`checkpoint state-file-1's directory: ${join(world.root, "state-file-1", "trainer.json")} does not exist`),
    });
    // An op naming no id gets one generated: the refusal names it.
    expect((await refusal(world.client.checkpoint({ controller_state: { file: "trainer.json" } }))).message).toMatch(/is not in checkpoint ckpt-\S+'s directory/);
    await mkdir(join(world.root, "state-file-1"), { recursive: true });
    await writeFile(join(world.root, "state-file-1", "trainer.json"), state);
    const other = createHash("sha256").update("something else").digest("hex");
    expect(await refusal(world.client.checkpoint({ checkpoint_id: "state-file-1", controller_state: { file: "trainer.json", sha256: other } }))).toMatchObject({
      code: "invalid_checkpoint_state",
    });
    await world.pnc.flush();
    monitor.stop();
    expect(monitor.log).toEqual([]);
    expect(hookLog).toEqual([]);
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    // The same id, now with a file that is there: published, the state file recorded.
    const sha256 = createHash("sha256").update(state).digest("hex");
    expect((await world.client.checkpoint({ checkpoint_id: "state-file-1", controller_state: { file: "trainer.json", sha256 } })).checkpoint_id).toBe("state-file-1");
    expect((await world.client.get("state-file-1")).manifest.controller_state).toEqual({ file: "trainer.json", sha256 });
  });

  it("retire and forget run callers before callees: environment, agent, then model and resources", async () => {
    const retired = await world.client.retire({ episode_ids: [{ rollout_id: "gone", attempt: 0 }] });
    expect(retired.participants).toHaveLength(5);
    const retires = hookLog.filter((h) => h.startsWith("retire:"));
    expect(retires).toHaveLength(5);
    expectStaged(retires, RETIRE_RANK);
    for (const p of world.participants) expect(p.handle.controlPlane.isRetired({ rollout_id: "gone", attempt: 0 })).toBe(true);
    await world.client.forget({ rollout_ids: ["gone"] });
    const forgets = hookLog.filter((h) => h.startsWith("forget:"));
    expect(forgets).toHaveLength(5);
    expectStaged(forgets, RETIRE_RANK);
    for (const p of world.participants) expect(p.handle.controlPlane.isRetired({ rollout_id: "gone", attempt: 0 })).toBe(false);
  });

  it("restore failure path: retires attempt+1 everywhere, resumes everyone, reports restore_failed", async () => {
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "q1", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "base-2" });
    // restore needs fresh processes
    await world.stopParticipants();
    await world.startParticipants();
    hookLog.length = 0;
    world.participant("agent2").adapter.failNext("install");
    const error = await refusal(world.client.restore({ checkpoint_id: "base-2", episode_ids: [{ rollout_id: "q1", attempt: 0 }] }));
    expect(error.code).toBe("restore_failed");
    expect(error.message).toContain("agent/agent2");
    const retires = hookLog.filter((h) => h.startsWith("retire:"));
    expect(retires).toHaveLength(5);
    expectStaged(retires, RETIRE_RANK);
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.handle.controlPlane.isRetired({ rollout_id: "q1", attempt: 1 })).toBe(true);
      expect(p.adapter.restored.size).toBe(0);
    }
    // after the clean-up retire, the four participants that had restored reopen in resume order
    const reopened = hookLog.slice(hookLog.indexOf(retires.at(-1)!) + 1).filter((h) => h.startsWith("open:"));
    expect(reopened).toHaveLength(4);
    expectStaged(reopened, RESUME_RANK);
  });

  it("a participant restarted while a checkpoint is open gets none of its messages; resume counts it as resumed and does not fence the id in the new process", async () => {
    const coordinator = world.coordinators[0]!;
    const ref = { kind: "model" as const, instance: "policy" };
    const before = coordinator.members.incarnationOf(ref);
    await world.client.prepare({ checkpoint_id: "restart-1" });
    // SIGKILL-and-restart, in process: the old participant goes away, a new one (new incarnation) takes its subjects
    const old = world.participant("policy");
    await old.handle.stop();
    world.participants.splice(world.participants.indexOf(old), 1);
    await world.startParticipants([ref]);
    await waitUntil(() => coordinator.members.incarnationOf(ref) !== before, "the coordinator to see the new incarnation", 5000);
    const resumed = await world.client.resume({ checkpoint_id: "restart-1" });
    expect(resumed.participants.find((p) => p.instance === "policy")).toMatchObject({ idempotent: true });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    // The new process never saw restart-1, so the id is not fenced there: a late prepare of it is still accepted.
    const target = { deployment: world.deployment, ...ref, token: PARTICIPANT_TOKEN };
    const epoch = coordinator.lease.state().epoch!;
    const deadline_ts = Date.now() / 1000 + 5;
    expect(await controlRequest(world.pnc, target, "prepare", { checkpoint_id: "restart-1", deadline_ts, epoch })).toMatchObject({ phase: "prepared" });
    expect(await controlRequest(world.pnc, target, "resume", { checkpoint_id: "restart-1", deadline_ts, epoch })).toMatchObject({ phase: "idle" });
  });

  it("a restarted participant the membership view does not know yet refuses the open checkpoint's messages (stale_incarnation) and is not fenced", async () => {
    const coordinator = world.coordinators[0]!;
    const ref = { kind: "model" as const, instance: "policy" };
    const old = world.participant("policy");
    // What the participant announces is its control plane's own incarnation.
    await waitUntil(() => coordinator.members.incarnationOf(ref) === old.handle.controlPlane.incarnation, "the coordinator to see the announced incarnation", 5000);
    await world.client.prepare({ checkpoint_id: "unannounced-1" });
    // Restarted, subscribed, but its announcement has not reached the coordinator: the view holds the
    // old incarnation (or, once the old entry's delete arrives, none), never the new one.
    await old.handle.stop();
    world.participants.splice(world.participants.indexOf(old), 1);
    const [fresh] = await world.startParticipants([ref], { announce: false });
    expect(coordinator.members.incarnationOf(ref)).not.toBe(fresh!.handle.controlPlane.incarnation);
    hookLog.length = 0;
    try {
      const error = await refusal(world.client.commit({ checkpoint_id: "unannounced-1" }));
      expect(error.code).toBe("stale_incarnation");
      expect(error.message).toContain("model/policy: stale_incarnation");
      expect(fresh!.handle.controlPlane.currentPhase).toBe("idle");
      expect(hookLog.filter((h) => h.endsWith("model/policy"))).toEqual([]);
      const resumed = await world.client.resume({ checkpoint_id: "unannounced-1" });
      expect(resumed.participants.find((p) => p.instance === "policy")).toMatchObject({ idempotent: true });
    } finally {
      await world.client.resume({ checkpoint_id: "unannounced-1" }).catch(() => undefined); // idempotent; keeps later tests independent
    }
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    // The resume reached the new process and was refused there, so the id is not fenced: a late prepare is still accepted.
    const target = { deployment: world.deployment, ...ref, token: PARTICIPANT_TOKEN };
    const epoch = coordinator.lease.state().epoch!;
    const deadline_ts = Date.now() / 1000 + 5;
    expect(await controlRequest(world.pnc, target, "prepare", { checkpoint_id: "unannounced-1", deadline_ts, epoch })).toMatchObject({ phase: "prepared" });
    expect(await controlRequest(world.pnc, target, "resume", { checkpoint_id: "unannounced-1", deadline_ts, epoch })).toMatchObject({ phase: "idle" });
  });

  it("restore success leaves everyone restored until resume", async () => {
    await world.stopParticipants();
    await world.startParticipants();
    // base-2's restore of q1 failed above: until the view shows these processes, this one would be taken for its retry.
    await viewShowsEveryone();
    const reply = await world.client.restore({ episode_ids: [{ rollout_id: "q1", attempt: 0 }] });
    expect(reply.checkpoint_id).toBe("base-2");
    expect(reply.participants.find((p) => p.instance === "policy")?.restored).toEqual(["q1-a1"]);
    expect(world.participant("policy").handle.controlPlane.currentPhase).toBe("restored");
    expect((await refusal(world.client.prepare({ checkpoint_id: "during-restore" }))).code).toBe("checkpoint_conflict");
    await world.client.resume({ checkpoint_id: "base-2" });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });

  it("a restore every participant refuses changes nothing: no retire, so the rollouts it restored before keep running", async () => {
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "rr1", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "base-rr" });
    await world.stopParticipants();
    await world.startParticipants();
    const scope = [{ rollout_id: "rr1", attempt: 0 }];
    await world.client.restore({ checkpoint_id: "base-rr", episode_ids: scope });
    await world.client.resume({ checkpoint_id: "base-rr" });
    hookLog.length = 0;
    // The same restore again, into the processes now running rr1's attempt 1: each refuses (the id
    // was resumed here); retiring attempt 1 would fence the live continuation everywhere.
    const error = await refusal(world.client.restore({ checkpoint_id: "base-rr", episode_ids: scope }));
    expect(error.code).toBe("stale_checkpoint");
    expect(hookLog.filter((h) => h.startsWith("retire:"))).toEqual([]);
    for (const p of world.participants) {
      expect(p.handle.controlPlane.isRetired({ rollout_id: "rr1", attempt: 1 })).toBe(false);
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
    }
  });

  // A refused restore changed nothing: before, its entry's plain removal overwrote the record of
  // how the id's earlier restore settled, and a later leader answered that restore's retried resume
  // from memory again (docs/api.md, resume).
  it("a restore every participant refuses leaves the journal's record of the id's earlier restore (restored) as it was", async () => {
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "rk1", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "base-rk" });
    await world.stopParticipants();
    await world.startParticipants();
    await viewShowsEveryone();
    const scope = [{ rollout_id: "rk1", attempt: 0 }];
    await world.client.restore({ checkpoint_id: "base-rk", episode_ids: scope });
    await world.client.resume({ checkpoint_id: "base-rk" });
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    expect(await journal.restoreOutcome("base-rk")).toBe("restored");
    // Restored again into the processes that resumed from it: each refuses, nothing installed.
    expect((await refusal(world.client.restore({ checkpoint_id: "base-rk", episode_ids: scope }))).code).toBe("stale_checkpoint");
    expect((await journal.list()).map((e) => e.checkpoint_id)).not.toContain("base-rk");
    expect(await journal.restoreOutcome("base-rk")).toBe("restored");
  });

  it("a restore of a checkpoint the same processes already resumed from: every one refuses it stale_checkpoint, answered as that refusal; nothing retired, resumed or journaled, and its resume still succeeds", async () => {
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "sr1", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "base-sr" });
    await viewShowsEveryone();
    hookLog.length = 0;
    const monitor = monitorPhaseMessages(world.pnc, world.deployment);
    await world.pnc.flush();
    // Only the trainer crashed: its successor restores LATEST into the Gym processes that resumed from it.
    const error = await refusal(world.client.restore({ checkpoint_id: "base-sr", episode_ids: [{ rollout_id: "sr1", attempt: 0 }] }));
    await world.pnc.flush();
    monitor.stop();
    expect(error.code).toBe("stale_checkpoint");
    for (const p of world.participants) expect(error.message).toContain(`${p.kind}/${p.instance}: stale_checkpoint`);
    // A refusal: no clean-up (no retire, no resume), nobody parked, nothing left in the journal.
    expect(monitor.log.map((m) => m.op).filter((op) => op !== "restore")).toEqual([]);
    expect(hookLog.filter((h) => h.startsWith("retire:") || h.startsWith("close:") || h.startsWith("open:"))).toEqual([]);
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.handle.controlPlane.isRetired({ rollout_id: "sr1", attempt: 1 })).toBe(false);
    }
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    await waitUntil(async () => !(await journal.list()).some((e) => e.checkpoint_id === "base-sr"), "base-sr's journal entry removed", 5000);
    expect((await world.client.status()).checkpoint).toBeNull();
    // As for an id never restored: its resume (closed by the checkpoint op) is the idempotent success.
    expect(await world.client.resume({ checkpoint_id: "base-sr" })).toEqual({ checkpoint_id: "base-sr", participants: [] });
    // The same restore again is refused the same way (nothing remembered as a failure).
    expect((await refusal(world.client.restore({ checkpoint_id: "base-sr", episode_ids: [{ rollout_id: "sr1", attempt: 0 }] }))).code).toBe("stale_checkpoint");
  });

  it("restore of a stop checkpoint into the processes still parked in it: each refuses, nothing is retired, everyone resumes", async () => {
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "st1", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "stop-held", stop: true });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("committed");
    hookLog.length = 0;
    const error = await refusal(world.client.restore({ checkpoint_id: "stop-held", episode_ids: [{ rollout_id: "st1", attempt: 0 }] }));
    // Parked in the stop checkpoint (invalid_phase): not answered as a bare refusal, which would leave
    // them parked; the clean-up resumes them (a collector restarted against the same servers relies on it).
    expect(error.code).toBe("restore_failed");
    expect(error.message).toContain("nothing was retired");
    expect(hookLog.filter((h) => h.startsWith("retire:"))).toEqual([]);
    // resumed, so nothing stays parked until its lease expires; the controller restarts st1 from input
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.handle.controlPlane.isRetired({ rollout_id: "st1", attempt: 1 })).toBe(false);
    }
  });

  it("a clean-up retire that fails at a participant is retried until it frees attempt+1 there, before that participant resumes", async () => {
    for (const instance of ["env1", "policy", "agent1", "tools"]) world.participant(instance).adapter.addEpisode({ rollout_id: "rf1", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "base-rf" });
    await world.stopParticipants();
    await world.startParticipants();
    world.participant("agent2").adapter.failNext("install");
    // The resources server's first two frees of the restored rf1-a1 fail (a transient error).
    const tools = world.participant("tools").adapter;
    const retire = tools.retire.bind(tools);
    let failing = 2;
    tools.retire = async (episodes) => {
      if (failing-- > 0) {
        hookLog.push("retire:resources/tools");
        throw new Error("scripted transient free failure");
      }
      return retire(episodes);
    };
    hookLog.length = 0;
    const error = await refusal(world.client.restore({ checkpoint_id: "base-rf", episode_ids: [{ rollout_id: "rf1", attempt: 0 }] }));
    expect(error.code).toBe("restore_failed");
    expect(error.message).toContain("agent/agent2");
    expect(hookLog.filter((h) => h === "retire:resources/tools")).toHaveLength(3);
    // Resumed only once attempt+1 was freed there: the restored rollout cannot continue beside its restart from input.
    expect(hookLog.indexOf("open:resources/tools")).toBeGreaterThan(hookLog.lastIndexOf("retire:resources/tools"));
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.adapter.restored.size).toBe(0);
    }
  });

  it("a restore retried after its restore_failed, into the same processes, answers that restore_failed again and sends nothing; once they restarted it is a new restore", async () => {
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "rt1", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "base-retry" });
    await world.stopParticipants();
    await world.startParticipants();
    await viewShowsEveryone();
    const scope = [{ rollout_id: "rt1", attempt: 0 }];
    world.participant("agent2").adapter.failNext("install");
    const first = await refusal(world.client.restore({ checkpoint_id: "base-retry", episode_ids: scope }));
    expect(first.code).toBe("restore_failed");
    expect(first.message).toContain("agent/agent2");
    // Its reply was lost, say: the controller sends the same restore again.
    const installs = () => world.participants.map((p) => p.adapter.hooks().filter((h) => h === "install").length);
    const installed = installs();
    const monitor = monitorPhaseMessages(world.pnc, world.deployment);
    await world.pnc.flush();
    const retry = await refusal(world.client.restore({ checkpoint_id: "base-retry", episode_ids: scope, deadline_ts: Date.now() / 1000 + 5 }));
    await world.pnc.flush();
    monitor.stop();
    expect(retry.code).toBe("restore_failed");
    expect(retry.message).toBe(first.message);
    expect(monitor.log).toEqual([]);
    expect(installs()).toEqual(installed);
    // Another scope is another restore: each process refuses it (the id was resumed there), answered as that refusal.
    expect((await refusal(world.client.restore({ checkpoint_id: "base-retry", episode_ids: [] }))).code).toBe("stale_checkpoint");
    // It changed nothing: the first scope's retry still gets its restore_failed.
    expect((await refusal(world.client.restore({ checkpoint_id: "base-retry", episode_ids: scope }))).message).toBe(first.message);
    // Fresh processes: the same restore again is a new one, and it restores.
    await world.stopParticipants();
    await world.startParticipants();
    await viewShowsEveryone();
    const reply = await world.client.restore({ checkpoint_id: "base-retry", episode_ids: scope });
    expect(reply.participants.find((p) => p.instance === "policy")?.restored).toEqual(["rt1-a1"]);
    await world.client.resume({ checkpoint_id: "base-retry" });
  });

  for (const announce of [true, false]) {
    it(`a participant restarted between restore and resume (${announce ? "the view shows it" : "it refuses as another incarnation"}): the resume is restore_failed and attempt+1 is retired everywhere`, async () => {
      const coordinator = world.coordinators[0]!;
      for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "lost1", attempt: 0 }, { n: 1 });
      const id = `base-lost-${announce}`;
      await world.client.checkpoint({ checkpoint_id: id });
      await world.stopParticipants();
      await world.startParticipants();
      const ref = { kind: "environment" as const, instance: "env1" };
      const old = world.participant("env1");
      await waitUntil(() => coordinator.members.incarnationOf(ref) === old.handle.controlPlane.incarnation, "the coordinator to see the fresh process", 5000);
      await world.client.restore({ checkpoint_id: id, episode_ids: [{ rollout_id: "lost1", attempt: 0 }] });
      // SIGKILL-and-restart, in process: what env1 restored is gone with it
      await old.handle.stop();
      world.participants.splice(world.participants.indexOf(old), 1);
      const [fresh] = await world.startParticipants([ref], { announce });
      if (announce) await waitUntil(() => coordinator.members.incarnationOf(ref) === fresh!.handle.controlPlane.incarnation, "the coordinator to see the restart", 5000);
      hookLog.length = 0;
      const error = await refusal(world.client.resume({ checkpoint_id: id }));
      expect(error.code).toBe("restore_failed");
      expect(error.message).toContain("environment/env1");
      expect(hookLog.filter((h) => h.startsWith("retire:"))).toHaveLength(5);
      for (const p of world.participants) {
        expect(p.handle.controlPlane.isRetired({ rollout_id: "lost1", attempt: 1 })).toBe(true);
        expect(p.handle.controlPlane.currentPhase).toBe("idle");
        expect(p.adapter.restored.size).toBe(0);
      }
      // closed: a retry answers from the closed id, and the next checkpoint opens
      await world.client.forget({ rollout_ids: ["lost1"] });
    });
  }
});

describe("expected_participants: a live participant missing from the membership registry", () => {
  const episode = { rollout_id: "e1", attempt: 0 };
  async function worldWith(expected: string[] | undefined) {
    const w = await startWorld();
    await w.startParticipants([{ kind: "environment", instance: "env1" }, { kind: "model", instance: "policy" }]);
    // Alive and subscribed, holding session state, but absent from the registry (a lapsed heartbeat).
    const [res] = await w.startParticipants([{ kind: "resources", instance: "tools" }], { announce: false });
    await (await w.startCoordinator(expected ? { expected_participants: expected } : {})).whenReady();
    w.participant("env1").adapter.addEpisode(episode);
    w.participant("policy").adapter.addEpisode(episode);
    res!.adapter.addEpisode(episode, { counter: 2 });
    return w;
  }

  it("is an unreachable blocker when expected: nothing is committed or published, everyone resumed", async () => {
    const w = await worldWith(["environment/env1", "model/policy", "resources/tools"]);
    try {
      const error = await refusal(w.client.checkpoint({ checkpoint_id: "exp-1", episode_ids: [episode] }));
      expect(error.code).toBe("prepare_incomplete");
      expect(error.message).toContain("resources/tools: unreachable");
      expect(hookLog.some((h) => h.startsWith("export:"))).toBe(false);
      expect((await w.client.list()).latest).toBeNull();
      expect((await refusal(w.client.get("exp-1"))).code).toBe("not_found");
      // The prepare op reports it as a blocker of its stage; the resume closes the checkpoint as usual.
      const reply = await w.client.prepare({ checkpoint_id: "exp-2" });
      expect(reply.prepared).toBe(false);
      expect(reply.stopped_at).toEqual(["resources"]);
      expect(reply.blockers).toEqual([{ kind: "resources", instance: "tools", blockers: [], blocker_count: 0, code: "unreachable" }]);
      // status lists it too, in member order, as prepare reports it (not probed: it is not registered)
      const listed = (await w.client.status()).participants;
      expect(listed.map((p) => `${p.kind}/${p.instance}`)).toEqual(["environment/env1", "model/policy", "resources/tools"]);
      expect(listed[2]).toMatchObject({ reachable: false, phase: null, error: { code: "unreachable" } });
      expect(listed[2]!.error!.detail).toContain("not in the membership registry");
      await w.client.resume({ checkpoint_id: "exp-2" });
      for (const p of w.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    } finally {
      await w.close();
    }
  });

  it("fails a retire or forget when expected: the fence must reach it, so the op is not answered as done", async () => {
    const w = await worldWith(["environment/env1", "model/policy", "resources/tools"]);
    try {
      const retired = await refusal(w.client.retire({ episode_ids: [episode] }));
      expect(retired.message).toContain("resources/tools: unreachable");
      // The callers before it were retired (callers first); a retry once it is back reaches it too.
      expect(w.participant("env1").handle.controlPlane.status().retired_rollouts).toBe(1);
      const forgotten = await refusal(w.client.forget({ rollout_ids: [episode.rollout_id] }));
      expect(forgotten.message).toContain("resources/tools: unreachable");
    } finally {
      await w.close();
    }
  });

  it("with none registered, every expected one is an unreachable blocker (not not_found): checkpoint, prepare, retire and forget", async () => {
    const w = await startWorld();
    try {
      await (await w.startCoordinator({ expected_participants: ["environment/env1", "model/policy"] })).whenReady();
      const error = await refusal(w.client.checkpoint({ checkpoint_id: "none-1" }));
      expect(error.code).toBe("prepare_incomplete");
      expect(error.message).toContain("environment/env1: unreachable");
      expect((await w.client.list()).latest).toBeNull();
      const reply = await w.client.prepare({ checkpoint_id: "none-2" });
      expect(reply.prepared).toBe(false);
      expect(reply.stopped_at).toEqual(["environment"]);
      expect(reply.blockers).toEqual([{ kind: "environment", instance: "env1", blockers: [], blocker_count: 0, code: "unreachable" }]);
      await w.client.resume({ checkpoint_id: "none-2" });
      expect((await refusal(w.client.retire({ episode_ids: [episode] }))).message).toContain("environment/env1: unreachable");
      expect((await refusal(w.client.forget({ rollout_ids: [episode.rollout_id] }))).message).toContain("environment/env1: unreachable");
    } finally {
      await w.close();
    }
  });

  it("is left out when nothing is expected (the registry alone decides)", async () => {
    const w = await worldWith(undefined);
    try {
      await w.client.checkpoint({ checkpoint_id: "unexp-1", episode_ids: [episode] });
      const manifest = (await w.client.get("unexp-1")).manifest;
      expect(manifest.participants.map((p) => `${p.kind}/${p.instance}`).sort()).toEqual(["environment/env1", "model/policy"]);
    } finally {
      await w.close();
    }
  });
});
