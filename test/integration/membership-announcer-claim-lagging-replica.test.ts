import { Kvm, type KV } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MembershipAnnouncer } from "../../participants/control-plane/membership-announcer.js";
import { memberKey, membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";

// A restart after a crash claims its gone predecessor's entry, then writes its own by
// compare-and-set; a refused write is judged by the entry at the stream's leader, where only the
// predecessor found at claim may stand. The claim must read that entry at the leader too: a direct
// get (which any replica of an R3 bucket answers) from a replica that has not yet stored the
// predecessor's entry made the predecessor "nobody", and its entry at the leader then read as
// another process starting at the same time: the restart was refused (instance_conflict).
let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

describe("membership claim with a lagging replica", () => {
  it("a restart whose claim's read is answered by a replica lagging behind the crashed predecessor's entry takes the name over", async () => {
    const deployment = "claimlag";
    // The crashed predecessor's entry, at the stream's leader.
    const kv = await new Kvm(nats.nc).create(membersBucket(deployment), { history: 1, ttl: 15_000 });
    const now = Date.now() / 1000;
    await kv.put(memberKey("agent", "agent"), JSON.stringify({ kind: "agent", instance: "agent", incarnation: "inc-old", started_at: now, heartbeat_at: now, protocol_version: 1 }));
    // Every direct get of the restart's bucket handle is answered as by a replica without the entry.
    const asLaggingReplica = (bucket: KV) => void ((bucket as unknown as { jsm: { direct: { getMessage: () => Promise<null> } } }).jsm.direct.getMessage = async () => null);
    const restart = new MembershipAnnouncer(await nats.connect(), deployment, "agent", "agent", "inc-new", undefined, undefined, { onBucketOpened: asLaggingReplica });
    await restart.claim();
    await restart.start();
    const entry = await kv.get(memberKey("agent", "agent"));
    expect((entry!.json() as { incarnation: string }).incarnation).toBe("inc-new");
    await restart.stop();
  }, 20_000);
});
