import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LeaderLease } from "../../coordinator/ha/leader-lease.js";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import { leaderBucket, type Op } from "../../protocol/index.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { NatsServerProcess, startNats, type NatsFixture } from "../support/nats.js";

// A restarted participant's highest seen epoch starts from the leader lease, not 0: a deposed
// leader's delayed (in flight, or retried) restore, retire or forget is refused as its predecessor
// process would have refused it.
const TOKEN = "integration-secret";
let nats: NatsFixture;
let root: string;
const open: Array<{ stop(): Promise<void> }> = [];

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-floor-"));
});

afterAll(async () => {
  for (const handle of open.reverse()) await handle.stop().catch(() => undefined);
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

/** A (re)started participant: a fresh process of `instance`, as after a restart. */
async function participantOf(deployment: string, instance = "env_0"): Promise<ParticipantHandle<ScriptRecord>> {
  const handle = await startParticipant({ nc: await nats.connect(), deployment, instance, token: TOKEN, adapter: new ScriptableKind("environment"), checkpointRoot: root });
  open.push(handle);
  return handle;
}

/** A coordinator's lease that won; `renewed` has it write its epoch into the key (markServing renews at once). */
async function leaderOf(deployment: string, id: string, renewed = true): Promise<{ lease: LeaderLease; epoch: number }> {
  const lease = new LeaderLease({ nc: nats.nc, deployment, id, leaseMs: 60_000 });
  open.push(lease);
  await lease.start();
  const epoch = lease.state().epoch;
  if (epoch === null) throw new Error(`${id} did not win the lease`);
  if (renewed) await lease.markServing(epoch);
  return { lease, epoch };
}

function sender(deployment: string, instance = "env_0") {
  return (op: Op, body: unknown) => controlRequest(nats.nc, { deployment, kind: "environment", instance, token: TOKEN }, op, body, 5000);
}

const forgetAt = (epoch: number) => ({ ...phase("forget"), rollout_ids: ["r1"], epoch });
const retireAt = (epoch: number) => ({ ...phase("retire"), episode_ids: [{ rollout_id: "r1", attempt: 1 }], epoch });
const restoreAt = (epoch: number) => ({ ...phase("c1"), checkpoint_dir: join(root, "c1"), episode_ids: [{ rollout_id: "r1", attempt: 0 }], epoch });

describe("a restarted participant's epoch fence starts from the leader lease", () => {
  it("refuses a deposed leader's restore, retire and forget (stale_epoch) and admits the leader's", async () => {
    const deployment = "floor_led";
    const send = sender(deployment);
    const deposed = await leaderOf(deployment, "coord-a");
    await deposed.lease.stop(); // its successor wins the key
    const leader = await leaderOf(deployment, "coord-b");
    expect(leader.epoch).toBeGreaterThan(deposed.epoch);
    await participantOf(deployment);
    for (const [op, body] of [
      ["restore", restoreAt(deposed.epoch)],
      ["retire", retireAt(deposed.epoch)],
      ["forget", forgetAt(deposed.epoch)],
    ] as const) {
      expect(await send(op, body), op).toMatchObject({ error: { code: "stale_epoch" } });
    }
    expect((await send("status", {})).epoch).toBe(leader.epoch);
    expect(await send("forget", forgetAt(leader.epoch))).toEqual({ forgotten: ["r1"] });
  });

  it("takes a fresh term's create (no epoch named yet) as the sequence just before its revision", async () => {
    const deployment = "floor_created";
    const send = sender(deployment);
    const deposed = await leaderOf(deployment, "coord-a");
    await deposed.lease.stop();
    const leader = await leaderOf(deployment, "coord-b", false);
    await participantOf(deployment);
    expect((await send("status", {})).epoch).toBe(leader.epoch - 1);
    expect((await send("forget", forgetAt(deposed.epoch))).error?.code).toBe("stale_epoch");
    expect(await send("forget", forgetAt(leader.epoch))).toEqual({ forgotten: ["r1"] });
  });

  it("while nobody leads, fences every past term and admits the next leader", async () => {
    const deployment = "floor_unled";
    const send = sender(deployment);
    const last = await leaderOf(deployment, "coord-a");
    await last.lease.stop(); // released: nobody leads
    await participantOf(deployment);
    expect((await send("forget", forgetAt(last.epoch))).error?.code).toBe("stale_epoch");
    const next = await leaderOf(deployment, "coord-b");
    expect(await send("forget", forgetAt(next.epoch))).toEqual({ forgotten: ["r1"] });
  });

  it("started while a campaign probes for the epoch floor, its floor does not push that campaign's epoch past its create", async () => {
    const deployment = "floor_campaign";
    const send = sender(deployment);
    const last = await leaderOf(deployment, "coord-a");
    await last.lease.stop(); // released: nobody leads
    const lastSeq = async () => (await (await new Kvm(nats.nc).open(leaderBucket(deployment))).status()).streamInfo.state.last_seq;
    const created = (await lastSeq()) + 1;
    const warned: string[] = [];
    const logger = { info() {}, warn: (_: unknown, msg: string) => void warned.push(msg), error() {}, child() { return logger; } };
    // The daemon's floor: what the registered participants report, here one (re)started after the create.
    const lease = new LeaderLease({
      nc: nats.nc,
      deployment,
      id: "coord-b",
      leaseMs: 60_000,
      logger: logger as never,
      epochFloor: async () => {
        await participantOf(deployment);
        return (await send("status", {})).epoch as number;
      },
    });
    open.push(lease);
    await lease.start();
    expect(warned).not.toContain("lease_revisions_behind_epochs_in_use");
    expect(lease.state().epoch).toBe(created);
    expect((await send("forget", forgetAt(last.epoch))).error?.code).toBe("stale_epoch");
    expect(await send("forget", forgetAt(created))).toEqual({ forgotten: ["r1"] });
  });

  // leaseIssued read from the real lease: an epoch above every one it issued (a message forged with
  // the participants' token) is refused, and the fence stays at the leader's, which is still
  // admitted. The unit tests inject epochIssued, so only this pins the read's own answer.
  it("refuses an epoch the lease never issued (invalid_request) and keeps admitting the leader's", async () => {
    const deployment = "floor_forged";
    const send = sender(deployment);
    const leader = await leaderOf(deployment, "coord-a");
    await participantOf(deployment);
    expect((await send("forget", forgetAt(leader.epoch + 1000))).error?.code).toBe("invalid_request");
    expect((await send("status", {})).epoch).toBe(leader.epoch);
    expect(await send("forget", forgetAt(leader.epoch))).toEqual({ forgotten: ["r1"] });
  });

  it("starts unfenced where no coordinator ever ran (no leader bucket)", async () => {
    const deployment = "floor_none";
    const send = sender(deployment);
    await participantOf(deployment);
    expect((await send("status", {})).epoch).toBe(0);
    expect(await send("forget", forgetAt(1))).toEqual({ forgotten: ["r1"] });
  });
});

describe("a participant that cannot read the leader bucket", () => {
  it("starts all the same, unfenced as before (its account has no JetStream; announce off, as the registry needs it too)", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-floor-nojs-"));
    await writeFile(join(dir, "nats.conf"), `accounts { APP: { users: [ { user: "app", password: "app-pass" } ] } }\n`);
    const server = await NatsServerProcess.start({ args: ["-c", join(dir, "nats.conf")] });
    const nc = await connect({ servers: server.url, user: "app", pass: "app-pass" });
    try {
      const handle = await startParticipant({ nc, deployment: "floor_nojs", instance: "env_0", token: TOKEN, adapter: new ScriptableKind("environment"), announce: false });
      try {
        const send = (op: Op, body: unknown) => controlRequest(nc, { deployment: "floor_nojs", kind: "environment", instance: "env_0", token: TOKEN }, op, body, 5000);
        expect((await send("status", {})).epoch).toBe(0);
        expect(await send("forget", forgetAt(1))).toEqual({ forgotten: ["r1"] });
      } finally {
        await handle.stop();
      }
    } finally {
      await nc.close();
      await server.dispose();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
