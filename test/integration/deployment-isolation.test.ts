import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { LEADER_KEY } from "../../coordinator/ha/leader-lease.js";
import { startParticipant } from "../../participants/control-plane/start-participant.js";
import { leaderBucket, type Kind } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { refusalOf } from "../support/refusal.js";
import { DEFAULT_MEMBERS, LoggedKind, NO_HTTP, startWorld, type World } from "./coordinator-harness.js";

/**
 * Several deployments on one NATS server, the common case (one cluster-wide NATS, one deployment
 * per RL job), with names chosen to collide if anything were not scoped: one a prefix of another
 * (`job`, `job-1`), one differing only in case (`Job`). They share the participants' and the
 * controllers' tokens and the participants' instance names, so neither a token nor a name tells
 * them apart: only the deployment does. Each has one extra participant of its own, so a member seen
 * across deployments would show.
 */
const NAMES = ["job", "job-1", "Job"] as const;
const extraOf = (deployment: string) => ({ kind: "environment" as Kind, instance: `own-${deployment}` });
const membersOf = (deployment: string) => [...DEFAULT_MEMBERS, extraOf(deployment)];
const sortRefs = (refs: readonly { kind: string; instance: string }[]) => refs.map((r) => `${r.kind}/${r.instance}`).sort();

let nats: NatsFixture;
const worlds = new Map<string, World>();
const world = (name: (typeof NAMES)[number]) => worlds.get(name)!;

beforeAll(async () => {
  nats = await startNats();
  for (const name of NAMES) {
    const w = await startWorld({ nats, deployment: name });
    worlds.set(name, w);
    await w.startParticipants(membersOf(name));
    await w.startCoordinator(NO_HTTP);
  }
  await Promise.all([...worlds.values()].map((w) => w.coordinators[0]!.whenReady()));
}, 30_000);

afterAll(async () => {
  await Promise.allSettled([...worlds.values()].map((w) => w.close()));
  await nats?.close();
});

/** Every message on any gym-ckpt subject of any deployment, as `<deployment> <rest of the subject>`. */
function tapAllDeployments(nc: NatsConnection): { seen: string[]; stop(): void } {
  const seen: string[] = [];
  const sub = nc.subscribe("gym.ckpt.v1.>", { callback: (_err, msg) => void seen.push(msg.subject.split(".").slice(3).join(" ")) });
  return { seen, stop: () => sub.unsubscribe() };
}

describe("deployments sharing one NATS server", () => {
  it("each leads its own lease: three ready leaders at once, each lease naming its own coordinator", async () => {
    for (const name of NAMES) {
      const coordinator = world(name).coordinators[0]!;
      expect(coordinator.lease.state(), name).toMatchObject({ leader: true, ready: true });
      const held = await (await new Kvm(nats.nc).open(leaderBucket(name))).get(LEADER_KEY);
      expect((held?.json() as { id: string }).id, name).toBe(coordinator.id);
    }
    expect(new Set(NAMES.map((name) => world(name).coordinators[0]!.id)).size).toBe(NAMES.length);
  });

  it("each coordinator's membership and each controller's status list its own participants only", async () => {
    for (const name of NAMES) {
      const w = world(name);
      expect(sortRefs(await w.coordinators[0]!.members.list()), name).toEqual(sortRefs(membersOf(name)));
      const status = await w.client.status();
      expect(status.deployment, name).toBe(name);
      expect(status.coordinator.id, name).toBe(w.coordinators[0]!.id);
      expect(sortRefs(status.participants), name).toEqual(sortRefs(membersOf(name)));
      expect(status.participants.every((p) => p.reachable), name).toBe(true);
    }
  });

  it("one deployment's checkpoint sends phase messages to its own participants only, journals in its own journal, and lists in its own controller API only", async () => {
    const tap = tapAllDeployments(nats.nc);
    try {
      const prepared = await world("job").client.prepare({ checkpoint_id: "iso-1" });
      expect(prepared.prepared).toBe(true);
      // Open at `job`: its journal holds it, the others' hold nothing, their participants hold nothing.
      expect(await (await KvDecisionJournal.open(nats.nc, "job")).list()).toEqual([expect.objectContaining({ checkpoint_id: "iso-1" })]);
      for (const other of ["job-1", "Job"] as const) {
        expect(await (await KvDecisionJournal.open(nats.nc, other)).list(), other).toEqual([]);
        const status = await world(other).client.status();
        expect(status.checkpoint, other).toBeNull();
        expect(new Set(status.participants.map((p) => p.phase)), other).toEqual(new Set(["idle"]));
      }
      await world("job").client.commit({ checkpoint_id: "iso-1" });
      await world("job").client.publish({ checkpoint_id: "iso-1" });
      await world("job").client.resume({ checkpoint_id: "iso-1" });
    } finally {
      tap.stop();
    }
    await nats.nc.flush();
    // The other deployments' subjects carried only the status calls made above (read-only).
    const elsewhere = tap.seen.filter((subject) => !subject.startsWith("job ") && !subject.endsWith(" status"));
    expect(elsewhere).toEqual([]);
    // Every participant of `job` took every phase (extra one included), over `job`'s subjects alone.
    for (const op of ["prepare", "commit", "resume"]) {
      expect(sortRefs(tap.seen.filter((s) => s.startsWith("job p ") && s.endsWith(` ${op}`)).map((s) => ({ kind: s.split(" ")[2]!, instance: s.split(" ")[3]! }))), op).toEqual(
        sortRefs(membersOf("job")),
      );
    }
    expect((await world("job").client.list()).checkpoints.map((c) => c.checkpoint_id)).toEqual(["iso-1"]);
    for (const other of ["job-1", "Job"] as const) {
      expect(await world(other).client.list(), other).toMatchObject({ latest: null, checkpoints: [] });
      expect((await refusalOf(world(other).client.get("iso-1"))).code, other).toBe("not_found");
    }
  });

  it("a participant joining a deployment with another deployment's token is refused by that deployment's coordinator (unauthorized, naming it); the others are untouched", async () => {
    const w = world("job-1");
    const nc = await nats.connect();
    const adapter = new LoggedKind("environment", "wrong-token");
    const handle = await startParticipant({ nc, deployment: "job-1", instance: "wrong-token", token: "another-deployments-token", adapter, logger: pino({ level: "silent" }) });
    try {
      await expect.poll(async () => sortRefs(await w.coordinators[0]!.members.list()), { timeout: 5_000 }).toContain("environment/wrong-token");
      const status = await w.client.status();
      expect(status.participants.find((p) => p.instance === "wrong-token")).toMatchObject({ error: { code: "unauthorized" } });
      const refusal = await refusalOf(w.client.checkpoint({ checkpoint_id: "iso-wrong-token" }));
      expect(refusal.code).toBe("prepare_incomplete");
      expect(refusal.message).toContain("environment/wrong-token: unauthorized");
      expect(adapter.hooks()).toEqual([]); // the refused participant ran no hook
      // Not a member anywhere else.
      for (const other of ["job", "Job"] as const) expect(sortRefs(await world(other).coordinators[0]!.members.list()), other).not.toContain("environment/wrong-token");
    } finally {
      await handle.stop();
      await nc.close();
    }
  });

  it("a coordinator of another deployment refuses a checkpoint root that one deployment already uses (invalid_request), before it touches anything there", async () => {
    const owner = world("job");
    await owner.client.checkpoint({ checkpoint_id: "iso-root" });
    const before = await owner.client.list();
    expect(before.latest).toBe("iso-root");
    for (const other of ["job-1", "Job"] as const) {
      const refusal = await refusalOf(world(other).startCoordinator({ ...NO_HTTP, checkpoint_root: owner.root, retention: 1 }));
      expect(refusal.code, other).toBe("invalid_request");
      expect(refusal.message, other).toContain(owner.root);
      expect(refusal.message, other).toContain(`"job"`);
      expect(refusal.message, other).toContain(`"${other}"`);
    }
    expect(await owner.client.list()).toEqual(before);
  });
});
