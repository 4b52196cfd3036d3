import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MembershipAnnouncer } from "../../participants/control-plane/membership-announcer.js";
import { memberKey, membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

// stop() deletes this process's membership entry by compare-and-set on the revision it last wrote.
// A heartbeat whose write is in flight when stop() is called may land first: the entry is still
// ours and must go all the same, not stay announced until the bucket's TTL (a checkpoint opened
// meanwhile would send prepare to a process that is gone).
let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

describe("membership announcer stop() racing a heartbeat in flight", () => {
  it("control: with no beat in flight, stop() removes the entry", async () => {
    const nc = await nats.connect();
    const announcer = new MembershipAnnouncer(nc, "annstop0", "environment", "env0", "inc-stop-0");
    await announcer.claim();
    await announcer.start();
    await announcer.stop();
    const kv = await new Kvm(nats.nc).open(membersBucket("annstop0"));
    const entry = await kv.get(memberKey("environment", "env0"));
    expect(entry?.operation === "PUT" ? entry.json() : undefined).toBeUndefined();
  }, 20_000);

  it("removes the entry of a stopped process even when a beat was being written", async () => {
    const nc = await nats.connect();
    const announcer = new MembershipAnnouncer(nc, "annstop", "environment", "env0", "inc-stop-1");
    await announcer.claim();
    await announcer.start();
    // A heartbeat fires (the interval's tick), and the owner stops the process in the same moment.
    (announcer as unknown as { tick(reconnected: boolean): void }).tick(false);
    await announcer.stop();
    // The beat has settled (it writes nothing once stopped).
    await waitUntil(() => !(announcer as unknown as { beatInFlight: boolean }).beatInFlight, "the heartbeat in flight to settle");
    const kv = await new Kvm(nats.nc).open(membersBucket("annstop"));
    const entry = await kv.get(memberKey("environment", "env0"));
    expect(entry?.operation === "PUT" ? entry.json() : undefined).toBeUndefined();
  }, 20_000);
});

describe("membership announcer stop() after a failed heartbeat", () => {
  it("removes the entry although the last beat failed (it dropped the bucket handle to re-open it)", async () => {
    const nc = await nats.connect();
    const announcer = new MembershipAnnouncer(nc, "annstop2", "environment", "env0", "inc-stop-2");
    await announcer.claim();
    await announcer.start();
    // One beat fails (a request timed out during a reconnect, say): the next beat re-opens the bucket.
    const internals = announcer as unknown as { kv: { put: () => Promise<number> } | undefined; tick(reconnected: boolean): void; beatInFlight: boolean };
    internals.kv!.put = async () => Promise.reject(new Error("TIMEOUT"));
    internals.tick(false);
    await waitUntil(() => !internals.beatInFlight && internals.kv === undefined, "the failed beat");
    await announcer.stop();
    const kv = await new Kvm(nats.nc).open(membersBucket("annstop2"));
    const entry = await kv.get(memberKey("environment", "env0"));
    expect(entry?.operation === "PUT" ? entry.json() : undefined).toBeUndefined();
  }, 20_000);
});
