import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { FsCheckpointStorage } from "../../participants/storage/fs-storage.js";
import { ScriptableKind } from "../../participants/testing/scriptable-kind.js";
import { startParticipant } from "../../participants/control-plane/start-participant.js";
import type { CheckpointStorage } from "../../participants/storage/checkpoint-storage.js";
import { DEFAULT_MEMBERS, LoggedKind, PARTICIPANT_TOKEN, startWorld, type World } from "./coordinator-harness.js";
import { phase } from "../support/control-requests.js";
import { participantsOverNats } from "../support/participants-over-nats.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";

// The coordinator checks every participant's manifest.json against checkpoint.json before it sends
// a restore; the restore message pins that digest (manifest_sha256), so a manifest replaced after
// the check, before the participant reads it, is refused there (invalid_checkpoint_state) before
// anything is installed, and the all-or-nothing restore fails as for any participant's refusal.

const OTHER_DIGEST = "0".repeat(64);

/** A manifest.json that is valid on its own (same records), but not the bytes checkpoint.json pins. */
async function replaceManifest(path: string): Promise<void> {
  const manifest = JSON.parse(await readFile(path, "utf8")) as { created_at: number };
  manifest.created_at += 1;
  await writeFile(path, `${JSON.stringify(manifest, null, 2)}\n`);
}

describe("a participant handed a restore pinned to another manifest digest, over NATS", () => {
  const { dir, serve, writeRecords } = participantsOverNats("itest-pin", "pin-secret");
  const scope = [{ rollout_id: "r", attempt: 0 }];

  it("refuses it invalid_checkpoint_state: nothing installed, its state unchanged; pinned to the right digest, or unpinned, it restores", async () => {
    const written = await writeRecords("c-pin", "agent", "a0", [{ episode_id: scope[0], state: { turn: 3 } }]);
    const kind = new ScriptableKind("agent");
    const send = await serve("agent", "a0", kind);
    const before = await send("status", {});

    const refused = await send("restore", phase("c-pin", { checkpoint_dir: dir("c-pin"), episode_ids: scope, manifest_sha256: OTHER_DIGEST }));
    expect(refused.error?.code).toBe("invalid_checkpoint_state");
    expect(refused.error.detail).toContain("manifest digest");
    expect(kind.hooks()).toEqual([]); // admission never closed, nothing installed
    expect(kind.restored.size).toBe(0);
    expect(await send("status", {})).toEqual({ ...before, epoch: 1 }); // only the epoch fence rose, as for any admitted op

    // Nothing cached or fenced: the same restore, pinned to the manifest's own digest, installs it.
    const restored = await send("restore", phase("c-pin", { checkpoint_dir: dir("c-pin"), episode_ids: scope, manifest_sha256: written.manifestSha256 }));
    expect(restored).toMatchObject({ phase: "restored", restored: ["r-a1"] });
    expect([...kind.restored.keys()]).toEqual(["r-a1"]);
    expect(await send("resume", phase("c-pin"))).toEqual({ phase: "idle", idempotent: false });

    // A coordinator before the field sends none: the manifest as found.
    const older = new ScriptableKind("agent");
    const sendOlder = await serve("agent", "a1", older);
    await writeRecords("c-pin", "agent", "a1", [{ episode_id: scope[0], state: { turn: 4 } }]);
    expect(await sendOlder("restore", phase("c-pin", { checkpoint_dir: dir("c-pin"), episode_ids: scope }))).toMatchObject({ phase: "restored", restored: ["r-a1"] });
    expect(await sendOlder("resume", phase("c-pin"))).toEqual({ phase: "idle", idempotent: false });
  });

  it("refuses a manifest replaced on disk although its restore names that manifest's former digest", async () => {
    const written = await writeRecords("c-swap", "environment", "e0", [{ episode_id: scope[0], state: { step: 1 } }]);
    await replaceManifest(join(dir("c-swap"), "gym", "environment", "e0", "manifest.json"));
    const kind = new ScriptableKind("environment");
    const send = await serve("environment", "e0", kind);
    const refused = await send("restore", phase("c-swap", { checkpoint_dir: dir("c-swap"), episode_ids: scope, manifest_sha256: written.manifestSha256 }));
    expect(refused.error?.code).toBe("invalid_checkpoint_state");
    expect(kind.hooks()).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);
    expect((await send("status", {})).phase).toBe("idle");
  });
});

describe("a coordinator's restore, over a real nats-server", () => {
  let world: World;
  beforeAll(async () => {
    world = await startWorld();
    await world.startParticipants();
    await (await world.startCoordinator()).whenReady();
  });
  afterAll(async () => {
    await world?.close();
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

  /** The body of every restore message published, by `kind/instance`. */
  function captureRestores(): { bodies: Map<string, Record<string, unknown>>; stop(): void } {
    const bodies = new Map<string, Record<string, unknown>>();
    const sub = world.pnc.subscribe(`gym.ckpt.v1.${world.deployment}.p.*.*.restore`, {
      callback: (_err, msg) => {
        const parts = msg.subject.split(".");
        bodies.set(`${parts[5]}/${parts[6]}`, msg.json());
      },
    });
    return { bodies, stop: () => sub.unsubscribe() };
  }

  it("pins each participant's digest; one whose manifest is replaced after the coordinator's check refuses before installing, and the restore fails all or nothing; with the manifest put back it restores", async () => {
    for (const instance of ["env1", "policy", "agent1", "agent2"]) world.participant(instance).adapter.addEpisode({ rollout_id: "rp", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "pinned" });
    const catalog = new CheckpointCatalog(world.root);
    const recorded = Object.fromEntries((await catalog.get("pinned")).participants.map((p) => [`${p.kind}/${p.instance}`, p.manifest_sha256]));
    const agent2Manifest = join(catalog.dirFor("pinned"), "gym", "agent", "agent2", "manifest.json");
    const committed = await readFile(agent2Manifest);

    // Fresh processes; agent2's storage replaces its manifest just before its first read, i.e.
    // after the coordinator checked every manifest and sent the restore.
    await world.stopParticipants();
    await world.startParticipants(DEFAULT_MEMBERS.filter((m) => m.instance !== "agent2"));
    const adapter = new LoggedKind("agent", "agent2");
    const fs = new FsCheckpointStorage();
    let swap = true;
    const storage: CheckpointStorage = {
      write: (...args) => fs.write(...args),
      async read(...args) {
        if (swap) {
          swap = false;
          await replaceManifest(agent2Manifest);
        }
        return fs.read(...args);
      },
    };
    const handle = await startParticipant({ nc: world.pnc, deployment: world.deployment, instance: "agent2", token: PARTICIPANT_TOKEN, adapter, storage, logger: pino({ level: "silent" }) });
    world.participants.push({ kind: "agent", instance: "agent2", adapter, handle });
    await viewShowsEveryone();

    const scope = [{ rollout_id: "rp", attempt: 0 }];
    const sent = captureRestores();
    await world.pnc.flush();
    const failed = await refusalOf(world.client.restore({ checkpoint_id: "pinned", episode_ids: scope }));
    await world.pnc.flush();
    sent.stop();
    expect(failed.code).toBe("restore_failed");
    expect(failed.message).toContain("agent/agent2: invalid_checkpoint_state");
    expect(Object.fromEntries([...sent.bodies].map(([who, body]) => [who, body.manifest_sha256]))).toEqual(recorded);
    // agent2 refused before anything changed: never closed admission, installed or was retired.
    expect(adapter.hooks()).toEqual([]);
    expect(adapter.restored.size).toBe(0);
    expect(handle.controlPlane.currentPhase).toBe("idle");
    // The others installed it: the clean-up retired attempt+1 there and resumed them.
    for (const p of world.participants.filter((q) => q.instance !== "agent2")) {
      expect(p.adapter.hooks()).toContain("install");
      expect(p.adapter.hooks()).toContain("retire");
      expect(p.adapter.restored.size).toBe(0);
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
    }

    // The committed bytes back, fresh processes: the restore, pinned alike, succeeds.
    await writeFile(agent2Manifest, committed);
    await world.stopParticipants();
    await world.startParticipants();
    await viewShowsEveryone();
    const again = captureRestores();
    await world.pnc.flush();
    const reply = await world.client.restore({ checkpoint_id: "pinned", episode_ids: scope });
    await world.pnc.flush();
    again.stop();
    expect(Object.fromEntries([...again.bodies].map(([who, body]) => [who, body.manifest_sha256]))).toEqual(recorded);
    expect(reply.participants.find((p) => p.instance === "agent2")?.restored).toEqual(["rp-a1"]);
    expect([...world.participant("agent2").adapter.restored.keys()]).toEqual(["rp-a1"]);
    await world.client.resume({ checkpoint_id: "pinned" });
  });
});
