import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { memberKey, membersBucket } from "../../protocol/index.js";
import { ScriptableKind, startParticipant } from "../../participants/index.js";
import { controlRequest } from "../support/control-requests.js";
import { refusalOf } from "../support/refusal.js";
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
});
