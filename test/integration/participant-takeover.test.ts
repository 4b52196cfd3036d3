import { Writable } from "node:stream";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import type { ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { memberKey, membersBucket, type Kind } from "../../protocol/index.js";
import { controlRequest, nobodyAnswers as nobodyAnswersName, phase } from "../support/control-requests.js";
import { startStallProxy, type StallProxy } from "../support/stall-proxy.js";
import { waitUntil } from "../support/wait-until.js";
import { LoggedKind, PARTICIPANT_TOKEN, startWorld, type World } from "./coordinator-harness.js";

// One process per kind/instance (docs/protocol.md). A process cut off from NATS may be replaced
// by a restart that finds nobody answering; when the old one comes back it must stop answering
// the name, or its refusals (and its hooks) would race the new process's on every message.
let world: World;
const proxies: StallProxy[] = [];
const connections: NatsConnection[] = [];
const handles: ParticipantHandle<ScriptRecord>[] = [];

beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await Promise.allSettled(handles.map((h) => h.stop()));
  await Promise.allSettled(connections.map((nc) => nc.close()));
  await Promise.allSettled(proxies.map((p) => p.close()));
  await world?.close();
});

/** A participant whose NATS connection runs through its own proxy (a network the test can cut), its log lines and hook calls kept. */
async function startBehindProxy(kind: Kind, instance: string) {
  const proxy = await startStallProxy(world.nats.server.port);
  proxies.push(proxy);
  const nc = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
  connections.push(nc);
  const lines: string[] = [];
  const logger = pino({ level: "info" }, new Writable({ write: (chunk: Buffer, _enc, done) => (lines.push(chunk.toString()), done()) }));
  const adapter = new LoggedKind(kind, instance);
  const hooks: string[] = [];
  for (const hook of ["closeAdmission", "openAdmission", "exportRecords", "retire", "forget"] as const) {
    const original = adapter[hook].bind(adapter) as (...args: unknown[]) => Promise<unknown>;
    (adapter as unknown as Record<string, unknown>)[hook] = (...args: unknown[]) => (hooks.push(hook), original(...args));
  }
  const handle = await startParticipant({ nc, deployment: world.deployment, instance, token: PARTICIPANT_TOKEN, adapter, logger, heartbeatMs: 200 });
  handles.push(handle);
  return { proxy, nc, handle, lines, hooks, adapter };
}

/** Whether nothing is subscribed to the name's status subject any more. */
const nobodyAnswers = (kind: Kind, instance: string) => nobodyAnswersName(world.pnc, world.deployment, kind, instance);
/** The member the name's registry entry announces (undefined: none, or a delete marker). */
const entryOf = async (kind: Kind, instance: string) => {
  const entry = await (await new Kvm(world.pnc).open(membersBucket(world.deployment))).get(memberKey(kind, instance));
  return entry?.operation === "PUT" ? entry.json<{ incarnation: string }>() : undefined;
};
const pending = <T>(promise: Promise<T>) => Promise.race([promise.then(() => false), new Promise<boolean>((resolve) => setImmediate(() => resolve(true)))]);

describe("a participant cut off from NATS", () => {
  it("taken over by a restarted process meanwhile: once back it stops answering the name, and checkpoints reach only the new process", async () => {
    const coordinator = await world.startCoordinator({ http: { enabled: false, host: "127.0.0.1", port: 0 } });
    await coordinator.whenReady();
    const p1 = await startBehindProxy("resources", "dup");
    await waitUntil(() => coordinator.members.incarnationOf({ kind: "resources", instance: "dup" }) === p1.handle.controlPlane.incarnation, "P1 in the view");

    // P1 loses NATS; a supervisor starts P2 under the same name: nobody answers there, so it takes over.
    p1.proxy.cut();
    await waitUntil(() => nobodyAnswers("resources", "dup"), "P1's subscriptions gone from the server");
    const p2 = await startParticipant({ nc: world.pnc, deployment: world.deployment, instance: "dup", token: PARTICIPANT_TOKEN, adapter: new LoggedKind("resources", "dup"), heartbeatMs: 200 });
    handles.push(p2);
    await waitUntil(() => coordinator.members.incarnationOf({ kind: "resources", instance: "dup" }) === p2.controlPlane.incarnation, "P2 in the view");

    // P1's connection comes back (its subscriptions with it): it finds P2's incarnation in its entry.
    p1.proxy.heal();
    await waitUntil(() => p1.lines.some((line) => line.includes('"code":"instance_conflict"')), "P1 noticing it was taken over");
    p1.hooks.length = 0;

    const outcome = await world.client.checkpoint({ checkpoint_id: "after-takeover", deadline_ts: Date.now() / 1000 + 10 }).then(
      (reply) => ({ ok: true as const, participants: reply.participants }),
      (error: { code?: string; message?: string }) => ({ ok: false as const, code: error.code, detail: error.message }),
    );
    expect({ outcome, oldProcessHooks: p1.hooks }).toEqual({ outcome: { ok: true, participants: 6 }, oldProcessHooks: [] });
    // Its owner is told (the reference servers exit 1 on it).
    expect(await p1.handle.lost).toMatchObject({ code: "instance_conflict" });
    // P2's entry is left alone, and with P2 gone nobody answers the name: P1 is not subscribed any more.
    expect((await entryOf("resources", "dup"))?.incarnation).toBe(p2.controlPlane.incarnation);
    await p2.stop();
    expect(await nobodyAnswers("resources", "dup")).toBe(true);
  }, 60_000);

  it("whose entry lapsed or was deleted meanwhile, but nobody took the name: it announces again and serves on", async () => {
    const p1 = await startBehindProxy("agent", "blip");
    const key = memberKey("agent", "blip");
    const bucket = membersBucket(world.deployment);
    const lapses = {
      // What the bucket's max_age leaves after a long outage: no message at all for the key.
      expired: async () => void (await (await jetstreamManager(world.pnc)).streams.purge(`KV_${bucket}`, { filter: `$KV.${bucket}.${key}` })),
      // `nats kv del`: a delete marker.
      deleted: async () => void (await (await new Kvm(world.pnc).open(bucket)).delete(key)),
    };
    for (const [how, lapse] of Object.entries(lapses)) {
      p1.proxy.cut();
      await waitUntil(() => nobodyAnswers("agent", "blip"), `P1's subscriptions gone from the server (${how})`);
      await lapse();
      expect(await entryOf("agent", "blip")).toBeUndefined();
      p1.proxy.heal();
      await waitUntil(async () => (await entryOf("agent", "blip"))?.incarnation === p1.handle.controlPlane.incarnation, `P1 announced again (${how})`);
      const status = await controlRequest(world.pnc, { deployment: world.deployment, kind: "agent", instance: "blip", token: PARTICIPANT_TOKEN }, "status", {});
      expect(status).toMatchObject({ kind: "agent", instance: "blip", phase: "idle" });
    }
    expect(await pending(p1.handle.lost)).toBe(true);
    expect(p1.lines.some((line) => line.includes("instance_conflict"))).toBe(false);
  }, 60_000);

  it("taken over while a prepare waits for readiness there: once back it answers that prepare as not prepared at once, and stop() does not wait for its deadline", async () => {
    const p1 = await startBehindProxy("environment", "held");
    p1.adapter.setBlockers(["r1"]);
    const target = { deployment: world.deployment, kind: "environment" as const, instance: "held", token: PARTICIPANT_TOKEN };
    const prepare = controlRequest(world.pnc, target, "prepare", phase("held-1", {}, 30), 40_000);
    await waitUntil(async () => (await controlRequest(world.pnc, target, "status", {})).phase === "preparing", "P1 waiting for its blocker");

    p1.proxy.cut();
    await waitUntil(() => nobodyAnswers("environment", "held"), "P1's subscriptions gone from the server");
    const p2 = await startParticipant({ nc: world.pnc, deployment: world.deployment, instance: "held", token: PARTICIPANT_TOKEN, adapter: new LoggedKind("environment", "held"), heartbeatMs: 200 });
    handles.push(p2);
    p1.proxy.heal();
    expect(await p1.handle.lost).toMatchObject({ code: "instance_conflict" });

    const started = Date.now();
    const reply = await prepare;
    await p1.handle.stop();
    expect({ phase: reply.phase, blockers: reply.report?.blockers }).toEqual({ phase: "preparing", blockers: ["r1"] });
    expect(Date.now() - started).toBeLessThan(5_000);
    await p2.stop();
  }, 60_000);
});
