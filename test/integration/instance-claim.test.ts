import { Kvm } from "@nats-io/kv";
import { connect } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { memberKey, membersBucket, participantSubject } from "../../protocol/index.js";
import { ScriptableKind } from "../../participants/testing/scriptable-kind.js";
import { startParticipant } from "../../participants/control-plane/start-participant.js";
import { controlRequest } from "../support/control-requests.js";
import { refusalOf } from "../support/refusal.js";
import { startStallProxy } from "../support/stall-proxy.js";
import { startNats, type NatsFixture } from "../support/nats.js";

// One process per kind/instance: two would split the requests on the shared subjects and
// overwrite each other's membership entry (every checkpoint failing with stale_incarnation).
const DEPLOYMENT = "claim";
const TOKEN = "claim-secret";
let nats: NatsFixture;

beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

const start = async (instance: string) => {
  const nc = await nats.connect();
  return { nc, handle: startParticipant({ nc, deployment: DEPLOYMENT, instance, token: TOKEN, adapter: new ScriptableKind("environment") }) };
};
const entryOf = async (instance: string) => (await (await new Kvm(nats.nc).open(membersBucket(DEPLOYMENT))).get(memberKey("environment", instance)))?.json<{ incarnation: string }>();

describe("a second process for the same kind/instance", () => {
  it("is refused (instance_conflict) while the first lives, and changes nothing", async () => {
    const first = await start("env1");
    const a = await first.handle;
    const before = await entryOf("env1");
    const second = await start("env1");
    expect((await refusalOf(second.handle)).code).toBe("instance_conflict");
    expect(await entryOf("env1")).toEqual(before);
    expect(before?.incarnation).toBe(a.controlPlane.incarnation);
    // The first still answers, alone (the refused one unsubscribed).
    const status = await controlRequest(nats.nc, { deployment: DEPLOYMENT, kind: "environment", instance: "env1", token: TOKEN }, "status", {});
    expect(status).toMatchObject({ instance: "env1", phase: "idle" });
    await a.stop();
    await Promise.all([first.nc.close(), second.nc.close()]);
  });

  it("takes over the entry of a predecessor that is gone (SIGKILL: its heartbeat still younger than the TTL)", async () => {
    const first = await start("env2");
    await first.handle;
    const old = await entryOf("env2");
    await first.nc.close(); // no stop(): the entry stays, as after a SIGKILL, but nobody answers
    const next = await start("env2");
    const b = await next.handle;
    expect((await entryOf("env2"))?.incarnation).toBe(b.controlPlane.incarnation);
    expect(b.controlPlane.incarnation).not.toBe(old?.incarnation);
    await b.stop();
    await next.nc.close();
  });

  it("of two starting at once, exactly one wins", async () => {
    const [x, y] = await Promise.all([start("env3"), start("env3")]);
    const settled = await Promise.allSettled([x.handle, y.handle]);
    const won = settled.filter((s) => s.status === "fulfilled");
    expect(won).toHaveLength(1);
    const lost = settled.find((s) => s.status === "rejected") as PromiseRejectedResult;
    expect(lost.reason.code).toBe("instance_conflict");
    const winner = (won[0] as PromiseFulfilledResult<Awaited<typeof x.handle>>).value;
    expect((await entryOf("env3"))?.incarnation).toBe(winner.controlPlane.incarnation);
    await winner.stop();
    await Promise.all([x.nc.close(), y.nc.close()]);
  });

  // Monitoring taps (`nats sub '>'`) subscribe to every subject, the status subject included, and
  // never answer: NATS then sends no "no responders", yet nobody serves the name.
  it("a silent subscriber on the status subject (a monitoring tap) does not block a legitimate start", async () => {
    const tap = await nats.connect();
    tap.subscribe(`gym.ckpt.v1.${DEPLOYMENT}.>`);
    tap.subscribe(participantSubject(DEPLOYMENT, "environment", "env4", "status"));
    await tap.flush();
    const only = await start("env4");
    const a = await only.handle;
    expect((await entryOf("env4"))?.incarnation).toBe(a.controlPlane.incarnation);
    await a.stop();
    await Promise.all([only.nc.close(), tap.close()]);
  });

  it("a subscriber answering what no participant would (`nats reply`) neither blocks a start nor hides a live participant", async () => {
    const echo = await nats.connect();
    const subject = participantSubject(DEPLOYMENT, "environment", "env5", "status");
    echo.subscribe(subject, { callback: (_error, msg) => void msg.respond("pong") });
    echo.subscribe(subject, { callback: (_error, msg) => void msg.respond(JSON.stringify({ kind: "model", instance: "env5" })) });
    await echo.flush();
    const first = await start("env5");
    const a = await first.handle;
    expect((await entryOf("env5"))?.incarnation).toBe(a.controlPlane.incarnation);
    // The live participant still conflicts, whatever else answers or listens on its subjects.
    const second = await start("env5");
    expect((await refusalOf(second.handle)).code).toBe("instance_conflict");
    expect((await entryOf("env5"))?.incarnation).toBe(a.controlPlane.incarnation);
    await a.stop();
    await Promise.all([first.nc.close(), second.nc.close(), echo.close()]);
  });

  it("a live participant too stalled to answer the probe is taken over, and stops serving the name once it wakes", async () => {
    const proxy = await startStallProxy(nats.server.port);
    const stalledNc = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const stalled = await startParticipant({ nc: stalledNc, deployment: DEPLOYMENT, instance: "env6", token: TOKEN, adapter: new ScriptableKind("environment"), heartbeatMs: 200 });
    // Still subscribed at the server, but nothing it sends (status reply, heartbeat) gets through.
    proxy.stall();
    const next = await start("env6");
    const b = await next.handle;
    expect((await entryOf("env6"))?.incarnation).toBe(b.controlPlane.incarnation);
    proxy.heal();
    expect(await stalled.lost).toMatchObject({ code: "instance_conflict" });
    expect((await entryOf("env6"))?.incarnation).toBe(b.controlPlane.incarnation);
    await Promise.all([stalled.stop(), b.stop()]);
    await Promise.all([stalledNc.close(), next.nc.close()]);
    await proxy.close();
  });
});
