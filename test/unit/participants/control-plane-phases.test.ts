import { existsSync } from "node:fs";
import { mkdtemp, readdir, rm, writeFile, unlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { FsCheckpointStorage, ManualClock, ParticipantControlPlane, ScriptableKind, type CheckpointStorage } from "../../../participants/index.js";
import { refusalCode as refused } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";

const T0 = 1_700_000_000;
const DEADLINE = T0 + 30;

let root: string;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-phases-"));
  clock = new ManualClock(T0 * 1000);
  kind = new ScriptableKind("environment");
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60, checkpointRoot: root });
});

afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

function call<O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) {
  const request = { deadline_ts: DEADLINE, epoch: 1, ...body };
  if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
  return plane.handle(op, request as never);
}

const flush = () => new Promise((resolve) => setImmediate(resolve));

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

async function checkpointWith(episodes: { rollout_id: string; attempt: number }[], id = "src"): Promise<string> {
  const source = new ScriptableKind("environment");
  const writer = new ParticipantControlPlane({ adapter: source, instance: "env0", clock, checkpointRoot: root });
  for (const e of episodes) source.addEpisode(e, { at: e.rollout_id });
  await writer.handle("prepare", { checkpoint_id: id, deadline_ts: DEADLINE, epoch: 1 });
  await writer.handle("commit", { checkpoint_id: id, deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: join(root, id), episode_ids: null, stop: false });
  writer.dispose();
  return join(root, id);
}

const snapshot = () => ({ status: plane.status(), admission: kind.admissionOpen, restored: [...kind.restored.keys()], live: [...kind.episodes.keys()] });

describe("restored phase", () => {
  it("refuses prepare, commit, restore of another id and ops naming another id, changing nothing", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const before = snapshot();
    expect(await refused(call("prepare", { checkpoint_id: "src" }))).toBe("invalid_phase");
    expect(await refused(call("prepare", { checkpoint_id: "c2" }))).toBe("checkpoint_conflict");
    expect(await refused(call("commit", { checkpoint_id: "src" }))).toBe("invalid_phase");
    expect(await refused(call("restore", { checkpoint_id: "c2", checkpoint_dir: dir, episode_ids: [] }))).toBe("checkpoint_conflict");
    expect(await refused(call("renew", { checkpoint_id: "c2", deadline_ts: T0 + 500 }))).toBe("checkpoint_conflict");
    expect(await refused(call("resume", { checkpoint_id: "c2" }))).toBe("checkpoint_conflict");
    expect(await refused(call("retire", { checkpoint_id: "c2", deadline_ts: T0 + 500, episode_ids: [{ rollout_id: "r1", attempt: 1 }] }))).toBe("checkpoint_conflict");
    expect(await refused(call("forget", { checkpoint_id: "c2", deadline_ts: T0 + 500, rollout_ids: ["r1"] }))).toBe("checkpoint_conflict");
    expect(snapshot()).toEqual(before);
  });

  it("retire and forget naming the restored id renew its lease; the restore's reply is kept", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 0 }]);
    const scope = [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 0 }];
    const reply = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    expect(plane.status().lease_expires_at).toBe(DEADLINE + 60);
    expect(await call("retire", { checkpoint_id: "src", deadline_ts: T0 + 100, episode_ids: [{ rollout_id: "r1", attempt: 1 }] })).toEqual({ retired: ["r1-a1"] });
    expect(plane.status().lease_expires_at).toBe(T0 + 160);
    expect([...kind.restored.keys()]).toEqual(["r2-a1"]);
    expect(await call("forget", { checkpoint_id: "src", deadline_ts: T0 + 200, rollout_ids: ["r1"] })).toEqual({ forgotten: ["r1"] });
    expect(plane.status().lease_expires_at).toBe(T0 + 260);
    expect(await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope })).toEqual(reply);
    expect(plane.currentPhase).toBe("restored");
  });

  it("a lease that expires while restored reopens and fences the id like a resume", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const scope = [{ rollout_id: "r1", attempt: 0 }];
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    clock.advance(91_000);
    for (let i = 0; i < 5; i++) await flush();
    expect({ phase: plane.currentPhase, admission: kind.admissionOpen, lease: plane.status().lease_expires_at }).toEqual({ phase: "idle", admission: true, lease: null });
    expect(await refused(call("restore", { checkpoint_id: "src", deadline_ts: T0 + 200, checkpoint_dir: dir, episode_ids: scope }))).toBe("stale_checkpoint");
    expect(await refused(call("renew", { checkpoint_id: "src", deadline_ts: T0 + 200 }))).toBe("stale_checkpoint");
    expect(await call("resume", { checkpoint_id: "src", deadline_ts: T0 + 200 })).toEqual({ phase: "idle", idempotent: true });
  });
});

describe("lease expiry while prepared", () => {
  it("stops the commit's write: no manifest, commit answers stale_checkpoint, admission reopens", async () => {
    const fs = new FsCheckpointStorage();
    const hold = deferred();
    let writes = 0;
    const storage: CheckpointStorage = {
      async write(target, records, options) {
        writes += 1;
        await hold.promise;
        return fs.write(target, records, options);
      },
      read: (...args) => fs.read(...args),
    };
    plane.dispose();
    plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: 60, checkpointRoot: root });
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const commit = call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 80 });
    const outcome = refused(commit); // observed at once: its deadline passes before the write ends
    await waitUntil(() => writes === 1, "the write to start");
    clock.advance(141_000); // past T0 + 80 + 60
    for (let i = 0; i < 5; i++) await flush();
    expect(plane.currentPhase).toBe("idle");
    hold.resolve();
    expect(await outcome).toBe("deadline_exceeded"); // its deadline passed first; the write goes on
    await waitUntil(async () => (await readdir(join(root, "c1/gym/environment/env0")).catch(() => [])).every((f) => !f.startsWith(".records")), "the stopped write to clean up");
    for (let i = 0; i < 5; i++) await flush();
    expect(existsSync(join(root, "c1/gym/environment/env0/manifest.json"))).toBe(false);
    expect(kind.admissionOpen).toBe(true);
    expect(await refused(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 200 }))).toBe("stale_checkpoint");
  });
});

describe("concurrent retries", () => {
  it("a commit retried while the first write runs awaits it; one with another scope meanwhile is a conflict", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const gate = deferred();
    kind.delay("exportRecords", gate.promise);
    const first = call("commit", { checkpoint_id: "c1" });
    await waitUntil(() => kind.hooks().includes("exportRecords"), "export");
    const second = call("commit", { checkpoint_id: "c1" });
    expect(await refused(call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("checkpoint_conflict");
    gate.resolve();
    const [a, b] = await Promise.all([first, second]);
    expect(b).toEqual(a);
    expect(kind.hooks().filter((h) => h === "exportRecords")).toHaveLength(1);
    expect(plane.currentPhase).toBe("committed");
  });

  it("a restore retried while the first installs gets the same reply and installs once", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const gate = deferred();
    kind.delay("install", gate.promise);
    const scope = [{ rollout_id: "r1", attempt: 0 }];
    const first = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    await waitUntil(() => kind.hooks().includes("install"), "install");
    const second = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    gate.resolve();
    const [a, b] = await Promise.all([first, second]);
    expect(b).toEqual(a);
    expect(kind.hooks().filter((h) => h === "install")).toHaveLength(1);
  });
});

describe("storage crash points", () => {
  it("a records file without a manifest (crash before the manifest) restores nothing", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    await unlink(join(dir, "gym/environment/env0/manifest.json"));
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("invalid_checkpoint_state");
    expect({ phase: plane.currentPhase, admission: kind.admissionOpen, restored: kind.restored.size }).toEqual({ phase: "idle", admission: true, restored: 0 });
  });

  it("temp files a crashed write left beside a published manifest do not disturb the restore", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const pdir = join(dir, "gym/environment/env0");
    await writeFile(join(pdir, ".records.jsonl.123.abcdef"), "partial");
    await writeFile(join(pdir, ".manifest.json.123.abcdef"), "{");
    const reply = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.restored).toEqual(["r1-a1"]);
  });

  it("a commit into a participant directory a crashed writer left records and temp files in publishes", async () => {
    const pdir = join(root, "c1/gym/environment/env0");
    const { mkdir } = await import("node:fs/promises");
    await mkdir(pdir, { recursive: true });
    await writeFile(join(pdir, ".records.jsonl.123.abcdef"), "partial");
    await writeFile(join(pdir, ".manifest.json.123.abcdef"), "{");
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const reply = await call("commit", { checkpoint_id: "c1" });
    expect(reply.manifest.record_count).toBe(1);
    expect((await readdir(pdir)).filter((f) => !f.startsWith("."))).toEqual(["manifest.json", reply.manifest.records_file].sort());
  });
});
