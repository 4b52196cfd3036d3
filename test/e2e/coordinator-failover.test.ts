import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { verifyCheckpoint } from "../../coordinator/publication/verify-checkpoint.js";
import { CONTROLLER_TOKEN, hookLog, monitorPhaseMessages, startWorld, type World } from "../integration/coordinator-harness.js";
import { startStallProxy } from "../support/stall-proxy.js";
import { waitUntil } from "../support/wait-until.js";
import { daemonArgs, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

let world: World;
const daemons: DaemonProcess[] = [];

beforeAll(async () => {
  ensureBuilt();
  world = await startWorld();
  await world.startParticipants();
  for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "k1", attempt: 0 }, { s: 1 });
});
afterAll(async () => {
  await Promise.allSettled(daemons.map((d) => d.kill()));
  await world?.close();
});
beforeEach(() => {
  hookLog.length = 0;
});

/** Starts a crashing daemon, waits until it serves, asks for a checkpoint and waits for the SIGKILL. */
async function crashDuringCheckpoint(id: string, at: "before-decision" | "after-decision" | "during-publication"): Promise<void> {
  // info: the lease's won/ready/lost lines end up in the failure message if the daemon never serves
  const daemon = spawnDaemon(daemonArgs(world, ["--no-http", "--coordinator-id", `crashing-${at}`, "--log-level", "info"]), { GYM_CKPT_TEST_CRASH_AT: at });
  daemons.push(daemon);
  const nc = await world.nats.connect();
  const client = new NatsControllerClient({ nc, deployment: world.deployment, token: CONTROLLER_TOKEN, leaderWaitMs: 30_000, slackMs: 500 });
  // status succeeds once the daemon is the ready leader serving the controller API
  await client.status().catch((error: unknown) => {
    const state = daemon.child.exitCode ?? daemon.child.signalCode ?? "running";
    throw new Error(`the daemon (${state}) never served status: ${String(error)}\n--- stderr ---\n${daemon.stderr()}\n--- stdout ---\n${daemon.stdout()}`);
  });
  const pending = client.checkpoint({ checkpoint_id: id, deadline_ts: Date.now() / 1000 + 1.5 }).catch((error: unknown) => error);
  const exit = await daemon.exited;
  expect(exit.signal).toBe("SIGKILL");
  expect(daemon.stderr()).toContain(`GYM_CKPT_TEST_CRASH_AT=${at}`);
  const outcome = await pending;
  expect(outcome).toMatchObject({ code: expect.stringMatching(/outcome_unknown|not_leader/) });
  const phase = at === "during-publication" ? "idle" : "prepared"; // that crash comes after the resume
  for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe(phase);
}

describe("a coordinator process killed with SIGKILL mid-checkpoint", () => {
  it("after the decision: the new leader re-drives commit, publishes and resumes", async () => {
    await crashDuringCheckpoint("killed-after", "after-decision");
    expect(hookLog.filter((h) => h.startsWith("export:"))).toHaveLength(0);
    const successor = await world.startCoordinator({ coordinator_id: "successor-1", http: { enabled: false, host: "127.0.0.1", port: 0 } });
    await successor.whenReady();
    expect(hookLog.filter((h) => h.startsWith("export:"))).toHaveLength(5);
    const catalog = new CheckpointCatalog(world.root);
    const manifest = await catalog.get("killed-after");
    expect(manifest.epoch).toBe(successor.lease.state().epoch);
    expect((await verifyCheckpoint(catalog, "killed-after")).records).toBe(3);
    expect(await catalog.latest()).toBe("killed-after");
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    await successor.stop();
    world.coordinators.splice(world.coordinators.indexOf(successor), 1);
  });

  it("during the publication, after the overlapping resume: the new leader re-drives commit (answered from the kept replies, nothing exported again) and publishes", async () => {
    await crashDuringCheckpoint("killed-publishing", "during-publication");
    const exported = hookLog.filter((h) => h.startsWith("export:")).length;
    expect(exported).toBe(5);
    const catalog = new CheckpointCatalog(world.root);
    await expect(catalog.get("killed-publishing")).rejects.toMatchObject({ code: "not_found" });
    const successor = await world.startCoordinator({ coordinator_id: "successor-3", http: { enabled: false, host: "127.0.0.1", port: 0 } });
    await successor.whenReady();
    expect(hookLog.filter((h) => h.startsWith("export:"))).toHaveLength(exported);
    const manifest = await catalog.get("killed-publishing");
    expect(manifest.epoch).toBe(successor.lease.state().epoch);
    expect((await verifyCheckpoint(catalog, "killed-publishing")).records).toBe(3);
    expect(await catalog.latest()).toBe("killed-publishing");
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    await successor.stop();
    world.coordinators.splice(world.coordinators.indexOf(successor), 1);
  });

  it("before the decision: the new leader resumes everyone (presumed abort)", async () => {
    await crashDuringCheckpoint("killed-before", "before-decision");
    const successor = await world.startCoordinator({ coordinator_id: "successor-2", http: { enabled: false, host: "127.0.0.1", port: 0 } });
    await successor.whenReady();
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    expect(hookLog.filter((h) => h.startsWith("export:"))).toHaveLength(0);
    await expect(new CheckpointCatalog(world.root).get("killed-before")).rejects.toMatchObject({ code: "not_found" });
    // the aborted id is fenced
    await expect(world.client.prepare({ checkpoint_id: "killed-before" })).rejects.toMatchObject({ code: "stale_checkpoint" });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });
});

describe("a hung (SIGSTOPped) leader", () => {
  it("does not take controller requests from the ready successor: every one is answered", async () => {
    // the spawned daemon must be the leader: earlier tests' successors go first
    for (const c of world.coordinators.splice(0)) await c.stop();
    const daemon = spawnDaemon(daemonArgs(world, ["--no-http", "--coordinator-id", "hung-leader", "--log-level", "info"]));
    daemons.push(daemon);
    const nc = await world.nats.connect();
    const client = new NatsControllerClient({ nc, deployment: world.deployment, token: CONTROLLER_TOKEN, leaderWaitMs: 30_000, timeoutMs: 2000 });
    try {
      await client.status();
      // Frozen, not dead: its NATS connection and subscriptions stay registered at the server.
      daemon.child.kill("SIGSTOP");
      const successor = await world.startCoordinator({ coordinator_id: "successor-hung", http: { enabled: false, host: "127.0.0.1", port: 0 } });
      await successor.whenReady();
      // A queue group shared with the frozen process would send it about half of these (each then
      // timing out as outcome_unknown); a plain subscription each means the live leader answers all.
      const answered = await Promise.allSettled(Array.from({ length: 8 }, () => client.list()));
      expect(answered.map((a) => (a.status === "rejected" ? String(a.reason) : a.status))).toEqual(Array(8).fill("fulfilled"));
      daemon.child.kill("SIGCONT");
      await successor.stop();
      world.coordinators.splice(world.coordinators.indexOf(successor), 1);
    } finally {
      daemon.child.kill("SIGCONT");
      await daemon.kill();
      await nc.close();
    }
  });
});

describe("a leader whose outgoing NATS traffic stalls (a half partition) as a checkpoint starts", () => {
  it("its prepare, delivered once the successor serves, is refused everywhere (the successor's recovery probe raised the epoch fence): nobody is left parked, the successor checkpoints", async () => {
    for (const c of world.coordinators.splice(0)) await c.stop();
    const proxy = await startStallProxy(world.nats.server.port);
    const NO_HTTP = { http: { enabled: false, host: "127.0.0.1", port: 0 } };
    // A: the real daemon, reaching NATS through the proxy (later flags win).
    const stalled = spawnDaemon(daemonArgs(world, ["--no-http", "--coordinator-id", "stalled-a", "--log-level", "info", "--nats-url", proxy.url, "--lease-ms", "2000"]));
    daemons.push(stalled);
    const nc = await world.nats.connect();
    const client = new NatsControllerClient({ nc, deployment: world.deployment, token: CONTROLLER_TOKEN, leaderWaitMs: 30_000, slackMs: 3000 });
    const monitor = monitorPhaseMessages(world.pnc, world.deployment);
    try {
      await client.status(); // A is the ready leader
      const successor = await world.startCoordinator({ coordinator_id: "successor-b", lease_ms: 2000, ...NO_HTTP });
      expect(successor.lease.state().leader).toBe(false);
      // A still receives the controller's checkpoint request; what it sends (its prepare, its renewals) is held.
      proxy.stall();
      let settled = false;
      void client.checkpoint({ checkpoint_id: "x-stalled", deadline_ts: Date.now() / 1000 + 30 }).catch(() => undefined).finally(() => (settled = true));
      // A's renewals never arrive: its key expires, B takes over and recovers (nothing journaled, nobody prepared).
      await successor.whenReady();
      const epochB = successor.lease.state().epoch!;
      for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
      // The stall ends: A's prepare (its older epoch) reaches the environment stage.
      proxy.heal();
      // What makes this scenario. Awaited by itself: the client may have given the op up already
      // (it re-reads the lease every lease period and finds A deposed), before the held bytes flow.
      const stale = () => monitor.log.filter((m) => m.op === "prepare" && m.epoch !== undefined && m.epoch < epochB);
      await waitUntil(() => stale().length > 0, "the deposed leader's held prepare delivered", 40_000);
      await waitUntil(() => settled, "the deposed leader's checkpoint op to be answered", 40_000);
      for (const p of world.participants) {
        expect({ instance: p.instance, phase: p.handle.controlPlane.currentPhase, checkpoint: p.handle.controlPlane.activeCheckpointId }).toEqual({ instance: p.instance, phase: "idle", checkpoint: null });
      }
      const next = await world.client.checkpoint({ checkpoint_id: "y-after", deadline_ts: Date.now() / 1000 + 10 });
      expect(next.participants).toBe(5);
      await successor.stop();
      world.coordinators.splice(world.coordinators.indexOf(successor), 1);
    } finally {
      monitor.stop();
      await stalled.kill();
      await proxy.close();
      await nc.close();
    }
  }, 90_000);
});
