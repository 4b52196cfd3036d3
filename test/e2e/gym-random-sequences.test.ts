import { afterEach, describe, expect, it } from "vitest";
import { captureKey, parseCaptureKey, type EpisodeId } from "../../protocol/index.js";
import { GYM_SERVERS, TASK, startGymWorld, type GymWorld, type RunResult } from "../support/gym-processes.js";
import { mulberry32 } from "../support/seeded-random.js";
import { waitUntil } from "../support/wait-until.js";
import { verifyHold as setVerifyHold } from "../support/verify-hold.js";

const HOLD_MS = 3000;

/**
 * Seeded random controller sequences against the real reference Gym: start, release, checkpoint,
 * start-then-checkpoint, retire, and after a checkpoint either resume or crash+restore; stragglers
 * take the resume → retire → re-dispatch path (one seed runs verify as a wait step and holds it, which
 * makes stragglers). Invariants at the end: every rollout ends with a
 * reward of 1, model calls ≤ 2 × attempts, every server idle with nothing left behind, every
 * published checkpoint verifies. Seeds and steps are bounded so the file stays well under 3 minutes.
 */
/** Seeds, and whether verify runs as a `wait` step there (verify holds then make stragglers). */
const SEEDS: [number, boolean][] = [
  [11, false],
  [41, true],
  [47, false],
];
const STEPS = 14;
const ROLLOUTS = 6;

interface Rollout {
  id: string;
  attempt: number;
  via: "environment" | "agent";
  state: "idle" | "running" | "done";
  /** Restored here and not yet re-dispatched: later checkpoints must keep it in scope. */
  pendingRestore: boolean;
  run: Promise<RunResult> | undefined;
  /** The /run reply arrived and waits to be settled. */
  replied: boolean;
  reward?: number;
}

let world: GymWorld | undefined;
afterEach(async () => {
  await world?.close();
  world = undefined;
});

async function sequence(seed: number, waitVerify: boolean): Promise<void> {
  const random = mulberry32(seed);
  const pick = <T>(items: T[]): T | undefined => (items.length ? items[Math.floor(random() * items.length)] : undefined);
  // A replayable verify's session is held a while after it (a checkpoint may be under way): a hold
  // well over this test's prepare gaps, short enough to see every session end before the last check.
  world = await startGymWorld({ args: { resources: [...(waitVerify ? ["--verify", "wait"] : []), "--replayable-end-hold-ms", String(HOLD_MS)] } });
  const w = world;
  const rollouts: Rollout[] = Array.from({ length: ROLLOUTS }, (_, i) => ({
    id: `s${seed}-r${i}`,
    attempt: 0,
    via: random() < 0.3 ? "agent" : "environment",
    state: "idle",
    pendingRestore: false,
    run: undefined,
    replied: false,
  }));
  const published: string[] = [];
  const retired = new Set<string>();
  let attempts = 0;
  const log: string[] = [];

  let verifyHeld = false;
  const verifyHold = async (on: boolean) => {
    await setVerifyHold(w.gym.urls.resources!, on);
    verifyHeld = on;
  };
  // With verify as a wait step, episodes are kept in flight by held verifies instead of held model calls.
  const hold = async () => (waitVerify ? undefined : w.backend.hold((await w.backend.calls()).length + 1 + Math.floor(random() * 4)));
  /** Settles one rollout's /run: done, refused before it started (same attempt again), or lost (next attempt). */
  const settle = async (r: Rollout) => {
    if (!r.run) return;
    const result = await r.run;
    r.run = undefined;
    r.replied = false;
    if (result.status === 200 && typeof result.body.reward === "number") {
      r.state = "done";
      r.reward = result.body.reward;
    } else if (result.body?.error?.code === "admission_closed") {
      attempts -= 1; // never started: the same attempt is dispatched again
      r.state = "idle";
    } else {
      r.state = "idle";
      r.attempt += 1;
    }
  };
  const start = (r: Rollout) => {
    r.state = "running";
    r.pendingRestore = false;
    attempts += 1;
    const episode = { rollout_id: r.id, attempt: r.attempt };
    log.push(`start ${captureKey(episode)} via ${r.via}`);
    r.run = w.run(r.id, r.attempt, TASK, r.via).catch((error: unknown) => ({ status: 0, body: { lost: String(error) } }));
    void r.run.then(() => (r.replied = true));
  };
  const running = () => rollouts.filter((r) => r.state === "running");
  const scope = (): EpisodeId[] => rollouts.filter((r) => r.state === "running" || r.pendingRestore).map((r) => ({ rollout_id: r.id, attempt: r.attempt }));

  /** Lets time pass until some episode waits in its held verify (bounded): the straggler case. */
  const untilVerifyInFlight = async () => {
    const stats = async () => (await (await fetch(`${w.gym.urls.resources}/admin/stats`)).json()) as { verify_started: number; verify_finished: number };
    await w
      .waitFor(async () => {
        const s = await stats();
        return s.verify_started > s.verify_finished;
      }, "a verify in flight", 2000)
      .catch(() => undefined);
  };
  const checkpoint = async (step: number) => {
    const id = `cp-${seed}-${step}`;
    if (waitVerify && verifyHeld && running().length && random() < 0.5) await untilVerifyInFlight();
    const prepared = await w.client.prepare({ checkpoint_id: id, deadline_ts: Date.now() / 1000 + 2 });
    if (!prepared.prepared) {
      // Stragglers: abort, retire them, re-dispatch later as the next attempt. (Their held verify
      // must be able to end: retire waits for a request in flight before it frees the session.)
      await w.client.resume({ checkpoint_id: id });
      if (verifyHeld) await verifyHold(false);
      const keys = new Set(prepared.blockers.flatMap((b) => b.blockers));
      const stragglers = rollouts.filter((r) => r.state === "running" && keys.has(captureKey({ rollout_id: r.id, attempt: r.attempt })));
      log.push(`${id} not prepared; retire ${stragglers.map((r) => r.id).join(",")}`);
      if (stragglers.length) {
        await w.client.retire({ episode_ids: stragglers.map((r) => ({ rollout_id: r.id, attempt: r.attempt })) });
        for (const r of stragglers) retired.add(r.id);
        await Promise.all(stragglers.map(settle));
      }
      return;
    }
    const inScope = scope();
    const commit = await w.client.commit({ checkpoint_id: id, episode_ids: inScope });
    await w.client.publish({ checkpoint_id: id });
    published.push(id);
    await w.verify(id);
    const exported = new Set(commit.participants.filter((p) => p.kind === "environment" || p.kind === "agent").flatMap((p) => p.episode_ids));
    // Outstanding /runs that were not exported finished before the checkpoint (or were refused): wait for them.
    await Promise.all(running().filter((r) => !exported.has(captureKey({ rollout_id: r.id, attempt: r.attempt }))).map(settle));
    if (random() < 0.5) {
      log.push(`${id} resume`);
      await w.client.resume({ checkpoint_id: id });
      return;
    }
    log.push(`${id} crash+restore ${[...exported].join(",")}`);
    await w.crashAndRestart(id);
    if (verifyHeld) await verifyHold(true); // the fresh resources process starts unheld
    await Promise.all(running().map(settle)); // every in-flight /run is lost with the processes
    const restored = rollouts.filter((r) => r.state === "idle").filter((r) => exported.has(captureKey({ rollout_id: r.id, attempt: r.attempt - 1 })) || (r.pendingRestore && exported.has(captureKey({ rollout_id: r.id, attempt: r.attempt }))));
    const sources = restored.map((r) => (r.pendingRestore ? { rollout_id: r.id, attempt: r.attempt } : { rollout_id: r.id, attempt: r.attempt - 1 }));
    for (const r of rollouts) if (r.pendingRestore && !restored.includes(r)) r.pendingRestore = false;
    await w.client.restore({ checkpoint_id: id, episode_ids: sources });
    await w.client.resume({ checkpoint_id: id });
    for (const r of restored) {
      r.attempt = sources[restored.indexOf(r)]!.attempt + 1;
      r.pendingRestore = true;
    }
  };

  await hold();
  if (waitVerify) await verifyHold(true);
  for (let step = 0; step < STEPS; step++) {
    const roll = random();
    const idle = rollouts.filter((r) => r.state === "idle");
    if (roll < 0.35) {
      const r = pick(idle);
      if (r) start(r);
    } else if (roll < 0.5) {
      log.push("release");
      await w.backend.release();
      await hold();
      if (waitVerify && !verifyHeld && random() < 0.7) {
        log.push("hold verify");
        await verifyHold(true);
      }

    } else if (roll < 0.75) {
      await checkpoint(step);
    } else if (roll < 0.85) {
      const r = pick(idle);
      if (r) start(r); // a checkpoint while the new episode is seeding
      await checkpoint(step);
    } else {
      const r = pick(rollouts.filter((x) => x.state === "running" || x.pendingRestore));
      if (r) {
        log.push(`retire ${captureKey({ rollout_id: r.id, attempt: r.attempt })}`);
        if (verifyHeld) await verifyHold(false); // retire waits for its requests in flight to end
        await w.client.retire({ episode_ids: [{ rollout_id: r.id, attempt: r.attempt }] });
        retired.add(r.id);
        if (r.state === "running") await settle(r);
        else {
          r.pendingRestore = false;
          r.attempt += 1;
        }
      }
    }
    for (const r of rollouts) if (r.run && r.replied) await settle(r);
  }

  // Drain: release everything and re-dispatch until every rollout has its reward.
  await w.backend.release();
  if (verifyHeld) await verifyHold(false);
  for (let round = 0; round < 10 && rollouts.some((r) => r.state !== "done"); round++) {
    await Promise.all(running().map(settle));
    for (const r of rollouts.filter((x) => x.state === "idle")) start(r);
    await Promise.all(running().map(settle));
  }
  if (retired.size) await w.client.forget({ rollout_ids: [...retired] });

  const context = `seed ${seed}:\n${log.join("\n")}`;
  await waitUntil(async () => (await w.status("resources")).report.counts.sessions === 0, `${context}\nthe resources sessions the last verifies hold to end`, HOLD_MS + 15_000);
  if (process.env.GYM_E2E_SEQ_LOG) process.stderr.write(`${context}\n`);
  expect(rollouts.map((r) => [r.id, r.state, r.reward]), context).toEqual(rollouts.map((r) => [r.id, "done", 1]));
  const calls = await w.backend.calls();
  expect(calls.length, context).toBeLessThanOrEqual(2 * attempts);
  for (const name of GYM_SERVERS) {
    const status = await w.status(name);
    expect({ name, phase: status.phase, retired: status.retired_rollouts, blockers: status.report.blocker_count }, context).toEqual({ name, phase: "idle", retired: 0, blockers: 0 });
    for (const count of ["episodes", "sessions", "inflight", "legacy_episodes", "restored_pending"]) {
      if (count in status.report.counts) expect({ name, count, value: status.report.counts[count] }, context).toEqual({ name, count, value: 0 });
    }
  }
  // Each checkpoint was verified when published; those retention kept are re-read once more.
  const kept = (await w.client.list()).checkpoints.map((c) => c.checkpoint_id);
  expect(kept.every((id) => published.includes(id)), context).toBe(true);
  for (const id of kept) await w.verify(id);
  // Capture keys in the call log parse back to the rollouts we ran.
  for (const call of calls) expect(call.capture_key && parseCaptureKey(call.capture_key)?.rollout_id.startsWith(`s${seed}-`)).toBe(true);
}

describe("random controller sequences against the reference Gym", () => {
  for (const [seed, waitVerify] of SEEDS) {
    it(`seed ${seed}${waitVerify ? " (verify as a wait step)" : ""}`, () => sequence(seed, waitVerify), 90_000);
  }
});
