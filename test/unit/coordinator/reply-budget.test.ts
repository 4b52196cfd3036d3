import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  CONTROLLER_OPS,
  GlobalManifestSchema,
  MAX_CONTROL_MESSAGE_BYTES,
  canonicalDigest,
  captureKey,
  encodeReply,
  type ControllerOp,
  type CtlReplyOf,
  type Kind,
} from "../../../protocol/index.js";
import { encodeControllerReply, fitControllerReply } from "../../../coordinator/api/reply-budget.js";
import { FOUR, makeEngine, uuidScope, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

/**
 * Controller replies over NATS must fit one message (1 MiB). Lists that grow with the scope times
 * the participants holding it are left out past that (null, with count and digest), so a commit
 * of 6,800 UUID rollouts held by four participants (1.06 MB in full) still answers.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-budget-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});


const bytes = (value: unknown) => Buffer.byteLength(JSON.stringify(value));

/** Encodes as the NATS API does, and checks the result against the op's strict reply schema. */
function overNats<O extends ControllerOp>(op: O, reply: CtlReplyOf<O>): CtlReplyOf<O> {
  const text = encodeControllerReply(op, reply);
  expect(Buffer.byteLength(text)).toBeLessThanOrEqual(MAX_CONTROL_MESSAGE_BYTES);
  return CONTROLLER_OPS[op].reply.parse(JSON.parse(text)) as CtlReplyOf<O>;
}

describe("controller replies over NATS", () => {
  it("commit and get of 6,800 UUID rollouts held by four participants leave lists out instead of failing with reply_too_large", async () => {
    const { engine, fake, catalog } = makeEngine(root, { members: FOUR });
    const scope = uuidScope(6800);
    const keys = scope.map(captureKey).sort();
    for (const m of FOUR) fake.exported.set(`${m.kind}.${m.instance}`, keys);
    await engine.prepare({ checkpoint_id: "big" });
    const full = await engine.commit({ checkpoint_id: "big", episode_ids: scope, stop: false });
    // What the NATS API answered before: the op succeeded, its reply did not fit.
    expect(bytes(full)).toBeGreaterThan(MAX_CONTROL_MESSAGE_BYTES);
    expect((await refusalOf(async () => encodeReply(full, "commit"))).code).toBe("reply_too_large");

    const commit = overNats("commit", full);
    const leftOut = commit.participants.filter((p) => p.episode_ids === null);
    expect(leftOut.length).toBeGreaterThanOrEqual(1);
    expect(leftOut.length).toBeLessThan(FOUR.length); // only as many as needed
    for (const p of leftOut) expect(p).toMatchObject({ episode_count: 6800, episode_ids_sha256: canonicalDigest(keys) });
    for (const p of commit.participants.filter((x) => x.episode_ids !== null)) {
      expect(p.episode_ids).toEqual(keys);
      expect(p).not.toHaveProperty("episode_count");
    }
    // The engine's own reply (kept for retries, written into checkpoint.json) stays complete.
    expect(full.participants.every((p) => p.episode_ids?.length === 6800)).toBe(true);
    expect((await engine.commit({ checkpoint_id: "big", episode_ids: scope, stop: false })).participants.every((p) => p.episode_ids?.length === 6800)).toBe(true);

    await engine.publish({ checkpoint_id: "big", controller_state: { inline: { step: 1 } } });
    const onDisk = GlobalManifestSchema.parse(JSON.parse(await readFile(join(catalog.dirFor("big"), "checkpoint.json"), "utf8")));
    expect(onDisk.participants.every((p) => p.episode_ids.length === 6800)).toBe(true);

    const fullGet = await engine.get({ checkpoint_id: "big" });
    expect(bytes(fullGet)).toBeGreaterThan(MAX_CONTROL_MESSAGE_BYTES);
    const get = overNats("get", fullGet);
    expect(get.latest).toBe(true);
    expect(get.manifest.controller_state).toEqual({ inline: { step: 1 } });
    expect(get.manifest.participants.some((p) => p.episode_ids === null && p.episode_count === 6800)).toBe(true);
    await engine.resume({ checkpoint_id: "big" });
  });

  it("get leaves out the scope and restarts too when the participants' lists are not enough, telling a left-out scope from everything", () => {
    const scope = uuidScope(20_000);
    const reply: CtlReplyOf<"get"> = {
      latest: false,
      manifest: {
        schema_version: 1,
        checkpoint_id: "c1",
        epoch: 1,
        prepared_at: 1,
        published_at: 2,
        stop: false,
        scope,
        restarts: scope.slice(0, 5000).map((e) => `${e.rollout_id}-a1`),
        participants: [],
        controller_state: null,
      },
    };
    const fitted = overNats("get", reply);
    expect(fitted.manifest.scope).toBeNull();
    expect(fitted.manifest).toMatchObject({ scope_count: 20_000, scope_sha256: canonicalDigest(scope) });
    expect(fitted.manifest.restarts).toEqual(reply.manifest.restarts); // the scope alone was enough
    expect(fitted.manifest).not.toHaveProperty("restart_count");
  });

  it("retire, forget and restore at 64 participants leave their per-participant echoes out", async () => {
    const members = Array.from({ length: 64 }, (_, i) => ({ kind: "environment" as Kind, instance: `e${i}` }));
    const { engine } = makeEngine(root, { members });
    const batch = uuidScope(1024); // the collector's retire batch
    const retire = await engine.retire({ episode_ids: batch });
    expect(bytes(retire)).toBeGreaterThan(MAX_CONTROL_MESSAGE_BYTES);
    const fitted = overNats("retire", retire);
    const keys = batch.map(captureKey);
    const left = fitted.participants.filter((p) => p.retired === null);
    expect(left.length).toBeGreaterThan(0);
    for (const p of left) expect(p).toMatchObject({ retired_count: 1024, retired_sha256: canonicalDigest(keys) });

    const forget = overNats("forget", await engine.forget({ rollout_ids: batch.map((e) => e.rollout_id) }));
    expect(forget.participants.some((p) => p.forgotten === null && p.forgotten_count === 1024)).toBe(true);

    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    const restore = overNats("restore", await engine.restore({ episode_ids: batch }));
    expect(restore.participants.some((p) => p.restored === null && p.restored_count === 1024)).toBe(true);
    await engine.resume({ checkpoint_id: "base" });
  });

  it("status at 300 participants with 100 blockers each empties the blocker samples, keeping the counts", async () => {
    const members = Array.from({ length: 300 }, (_, i) => ({ kind: "environment" as Kind, instance: `environment-instance-${i}` }));
    const { engine, fake } = makeEngine(root, { members });
    const blockers = uuidScope(100).map(captureKey);
    for (const m of members) fake.set(m.kind, m.instance, "status", { notReady: blockers });
    const status = await engine.status();
    expect(bytes(status)).toBeGreaterThan(MAX_CONTROL_MESSAGE_BYTES);
    const fitted = overNats("status", status);
    expect(fitted.participants).toHaveLength(300);
    expect(fitted.participants.every((p) => p.blocker_count === 100)).toBe(true);
    expect(fitted.participants.some((p) => p.blockers.length === 0)).toBe(true);
    expect(fitted.participants.some((p) => p.blockers.length === 100)).toBe(true);
  });

  it("prepare leaves per-participant restarts out before the union the controller needs", async () => {
    const { engine, fake } = makeEngine(root, { members: FOUR });
    const restarts = uuidScope(6800).map(captureKey).sort();
    for (const m of FOUR) fake.set(m.kind, m.instance, "prepare", { restarts });
    const prepared = await engine.prepare({ checkpoint_id: "p1" });
    expect(bytes(prepared)).toBeGreaterThan(MAX_CONTROL_MESSAGE_BYTES);
    const fitted = overNats("prepare", prepared);
    expect(fitted.restarts).toEqual(restarts);
    const left = fitted.participants.filter((p) => p.report?.restarts === null);
    expect(left.length).toBeGreaterThan(0);
    for (const p of left) expect(p.report).toMatchObject({ restart_count: 6800, restarts_sha256: canonicalDigest(restarts) });
    await engine.resume({ checkpoint_id: "p1" });
  });

  it("checkpoint cuts resume-failure details first, then leaves its restarts out", () => {
    const restarts = uuidScope(30_000).map((e) => captureKey({ ...e, attempt: 1 }));
    const reply: CtlReplyOf<"checkpoint"> = {
      checkpoint_id: "c1",
      epoch: 1,
      checkpoint_dir: "/ckpt/c1",
      manifest_path: "/ckpt/c1/checkpoint.json",
      published_at: 2,
      participants: 2,
      restarts,
      deleted: [],
      resume_failures: [{ kind: "model", instance: "m1", code: "internal_error", detail: "x".repeat(4096) }],
      timings_ms: { prepare: 1, commit: 1, publish: 1, resume: 1 },
    };
    const fitted = overNats("checkpoint", reply);
    expect(fitted.resume_failures[0]!.detail).toBe(`${"x".repeat(200)}… (4096 characters)`);
    expect(fitted).toMatchObject({ restarts: null, restart_count: 30_000, restarts_sha256: canonicalDigest(restarts) });
    // The reply it was fitted from is the engine's: not changed.
    expect(reply.restarts).toBe(restarts);
    expect(reply.resume_failures[0]!.detail).toHaveLength(4096);
  });

  it("list cuts the damaged checkpoints' details past the budget, keeping every checkpoint and every damaged id", () => {
    const checkpoints = Array.from({ length: 4000 }, (_, i) => ({ checkpoint_id: `c${String(i).padStart(19, "0")}`, published_at: 1, epoch: 1, participants: 4, stop: false }));
    const damaged = Array.from({ length: 2000 }, (_, i) => ({ checkpoint_id: `d${i}`, code: "invalid_checkpoint_state" as const, detail: "y".repeat(400) }));
    const reply: CtlReplyOf<"list"> = { latest: null, checkpoints, damaged };
    expect(bytes(reply)).toBeGreaterThan(MAX_CONTROL_MESSAGE_BYTES);
    const fitted = overNats("list", reply);
    expect(fitted.checkpoints).toEqual(checkpoints);
    expect(fitted.damaged!.map((d) => d.checkpoint_id)).toEqual(damaged.map((d) => d.checkpoint_id));
    expect(fitted.damaged!.some((d) => d.detail === `${"y".repeat(200)}… (400 characters)`)).toBe(true);
  });

  it("a reply that fits is answered as it is", async () => {
    const { engine } = makeEngine(root, { members: FOUR });
    const status = await engine.status();
    expect(fitControllerReply("status", status)).toBe(status);
    expect(encodeControllerReply("status", status)).toBe(JSON.stringify(status));
  });
});
