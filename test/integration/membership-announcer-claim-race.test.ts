import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MembershipAnnouncer } from "../../participants/control-plane/membership-announcer.js";
import { CheckpointError, memberKey, membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";

// A process restarted right after its predecessor crashed claims the predecessor's entry, then
// writes its own by compare-and-set on the revision it read. Between the two, that entry may change
// without anyone else starting: it expires (the bucket's TTL ran out: no message left), is deleted,
// or the stalled predecessor beats once more. The restart takes the name over all the same; only
// another incarnation writing there (a second process starting) is instance_conflict.
let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

const KEY = memberKey("agent", "agent");

/** A predecessor that announced and then died without removing its entry (its beats stopped). */
async function crashedPredecessor(deployment: string, incarnation: string): Promise<MembershipAnnouncer> {
  const announcer = new MembershipAnnouncer(await nats.connect(), deployment, "agent", "agent", incarnation);
  await announcer.claim();
  await announcer.start();
  (announcer as unknown as { stopWatching(): void }).stopWatching();
  // Crashed: it beats no more (its entry lives until the bucket's TTL, or the test changes it).
  clearInterval((announcer as unknown as { timer: NodeJS.Timeout }).timer);
  return announcer;
}

async function holder(deployment: string): Promise<string | undefined> {
  const entry = await (await new Kvm(nats.nc).open(membersBucket(deployment))).get(KEY);
  return entry?.operation === "PUT" ? (entry.json() as { incarnation: string }).incarnation : undefined;
}

describe("membership claim racing a change of the predecessor's entry", () => {
  it("the predecessor's entry expiring between claim and start (no message left): taken over", async () => {
    await crashedPredecessor("claimrace1", "inc-old");
    const restart = new MembershipAnnouncer(await nats.connect(), "claimrace1", "agent", "agent", "inc-new");
    await restart.claim();
    // What the bucket's TTL does: the message goes, no delete marker stays.
    const bucket = membersBucket("claimrace1");
    await (await jetstreamManager(nats.nc)).streams.purge(`KV_${bucket}`, { filter: `$KV.${bucket}.${KEY}` });
    await restart.start();
    expect(await holder("claimrace1")).toBe("inc-new");
    await restart.stop();
  }, 20_000);

  it("the predecessor's entry deleted between claim and start: taken over", async () => {
    await crashedPredecessor("claimrace2", "inc-old");
    const restart = new MembershipAnnouncer(await nats.connect(), "claimrace2", "agent", "agent", "inc-new");
    await restart.claim();
    await (await new Kvm(nats.nc).open(membersBucket("claimrace2"))).delete(KEY);
    await restart.start();
    expect(await holder("claimrace2")).toBe("inc-new");
    await restart.stop();
  }, 20_000);

  it("the stalled predecessor beating once more between claim and start: taken over", async () => {
    const old = await crashedPredecessor("claimrace3", "inc-old");
    const restart = new MembershipAnnouncer(await nats.connect(), "claimrace3", "agent", "agent", "inc-new");
    await restart.claim();
    await (old as unknown as { write(): Promise<void> }).write();
    await restart.start();
    expect(await holder("claimrace3")).toBe("inc-new");
    await restart.stop();
  }, 20_000);

  it("control: another process claiming the name between claim and start wins (instance_conflict)", async () => {
    await crashedPredecessor("claimrace4", "inc-old");
    const restart = new MembershipAnnouncer(await nats.connect(), "claimrace4", "agent", "agent", "inc-new");
    await restart.claim();
    const other = new MembershipAnnouncer(await nats.connect(), "claimrace4", "agent", "agent", "inc-other");
    await other.claim();
    await other.start();
    const refused = await restart.start().then(() => undefined, (error: unknown) => error);
    expect(refused).toBeInstanceOf(CheckpointError);
    expect((refused as CheckpointError).code).toBe("instance_conflict");
    expect(await holder("claimrace4")).toBe("inc-other");
    await other.stop();
  }, 20_000);
});
