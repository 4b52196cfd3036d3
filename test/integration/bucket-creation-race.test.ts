import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { LeaderLeaseReader } from "../../coordinator/client/leader-watch.js";
import { openBucketAsserted, readsFromStreamLeader } from "../../coordinator/membership/kv-bucket.js";
import { readEpochFloor } from "../../participants/control-plane/epoch-floor.js";
import { MembershipAnnouncer } from "../../participants/control-plane/membership-announcer.js";
import { awaitBucketStore, journalBucket, leaderBucket, MEMBER_TTL_MS, membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";

// nats-server 2.9.10 lists a stream another client is creating before the stream has its store; a
// STREAM.MSG.GET reaching it then panics the server (nil store, jetstream_api.go:3028). Every
// process of a fresh deployment opens the same buckets at start-up, so each reader that reads at
// the stream's leader races the creator here, many times over: the server must survive them all.
// A server per test: one that a reader panicked must not fail the next test.
let nats: NatsFixture;
beforeEach(async () => {
  nats = await startNats();
});
afterEach(async () => {
  await nats?.close();
});

const ROUNDS = 40;
const READERS = 6;

/** `read` in a loop on its own connection while another connection creates `bucket`, ROUNDS times. */
async function raceCreation(name: string, create: (round: string) => Promise<unknown>, read: (round: string) => Promise<unknown>): Promise<void> {
  for (let round = 0; round < ROUNDS && nats.server.running; round++) {
    const deployment = `${name}${round}`;
    let created = false;
    const reader = async () => {
      let reads = 0;
      // Bounded: the creation takes milliseconds; one more read after it lands on the finished store.
      while (!created && reads < 10_000) {
        await read(deployment).catch(() => undefined);
        reads += 1;
      }
      await read(deployment);
    };
    // Several readers at once: more of them land in the creation's window.
    const readers = Promise.all(Array.from({ length: READERS }, reader));
    await create(deployment).finally(() => (created = true));
    await readers;
  }
  expect(nats.server.running, nats.server.log).toBe(true);
}

describe("a bucket read at its stream's leader while another process creates it", () => {
  it("the controller client's leader-lease read (coordinator creating the leader bucket)", async () => {
    const nc = await nats.connect();
    const readers = new Map<string, LeaderLeaseReader>();
    await raceCreation(
      "racelease",
      (deployment) => openBucketAsserted(nats.nc, leaderBucket(deployment), { history: 1, ttl: 3000 }),
      async (deployment) => {
        if (!readers.has(deployment)) readers.set(deployment, new LeaderLeaseReader(nc, deployment));
        const leader = await readers.get(deployment)!.leader();
        if (leader === undefined) throw new Error("unreadable");
      },
    );
  }, 60_000);

});

/**
 * The subjects `nc` sends requests to, in order. The paths below read a bucket after a request
 * that already found the stream (its STREAM.INFO), which narrows the window to one round trip, too
 * narrow to hit at will; that they prove the store first is checked on the wire instead.
 */
function recordRequests(nc: NatsConnection): string[] {
  const subjects: string[] = [];
  const request = nc.request.bind(nc);
  nc.request = (subject, ...rest) => {
    subjects.push(subject);
    return request(subject, ...rest);
  };
  return subjects;
}

/** Whether a direct get of `bucket` went out before its first read at the stream's leader. */
function provedBeforeReading(subjects: string[], bucket: string): boolean {
  const proved = subjects.indexOf(`$JS.API.DIRECT.GET.KV_${bucket}`);
  const read = subjects.indexOf(`$JS.API.STREAM.MSG.GET.KV_${bucket}`);
  return read >= 0 && proved >= 0 && proved < read;
}

describe("bucket readers prove the store before they read at the stream's leader", () => {
  it("a starting participant's epoch floor", async () => {
    await openBucketAsserted(nats.nc, leaderBucket("provefloor"), { history: 1, ttl: 3000 });
    const nc = await nats.connect();
    const subjects = recordRequests(nc);
    expect(await readEpochFloor(nc, "provefloor")).toBe(0);
    expect(provedBeforeReading(subjects, leaderBucket("provefloor")), subjects.join("\n")).toBe(true);
  });

  it("a coordinator opening a bucket another process created (the journal)", async () => {
    await new Kvm(nats.nc).create(journalBucket("provejournal"), { history: 1 });
    const nc = await nats.connect();
    const subjects = recordRequests(nc);
    const kv = readsFromStreamLeader(await openBucketAsserted(nc, journalBucket("provejournal"), { history: 1, ttl: 0 }));
    expect(await kv.get("some-checkpoint")).toBeNull();
    expect(provedBeforeReading(subjects, journalBucket("provejournal")), subjects.join("\n")).toBe(true);
  });

  it("a participant claiming its membership entry in a bucket another process created", async () => {
    await new Kvm(nats.nc).create(membersBucket("proveclaim"), { history: 1, ttl: MEMBER_TTL_MS });
    const nc = await nats.connect();
    const subjects = recordRequests(nc);
    const announcer = new MembershipAnnouncer(nc, "proveclaim", "agent", "agent", "inc-1");
    await announcer.claim();
    expect(provedBeforeReading(subjects, membersBucket("proveclaim")), subjects.join("\n")).toBe(true);
  });
});

describe("awaitBucketStore", () => {
  it("tells a missing bucket from a ready one, and never waits on a missing one", async () => {
    expect(await awaitBucketStore(nats.nc, "never_created_bucket")).toBe("missing");
    await new Kvm(nats.nc).create("store_probe_ready", { history: 1 });
    expect(await awaitBucketStore(nats.nc, "store_probe_ready")).toBe("ready");
  });

  it("a bucket whose stream has no direct gets cannot be proven ready: read as before, without waiting out the bound", async () => {
    await new Kvm(nats.nc).create("store_probe_nodirect", { history: 1, allow_direct: false });
    const started = Date.now();
    expect(await awaitBucketStore(nats.nc, "store_probe_nodirect", 30_000)).toBe("unprovable");
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});

describe("the leader-lease read of an op whose reply came", () => {
  it("sends nothing once its stop aborted: a request sent as the connection closes would keep its 5 s timer, and a CLI process alive", async () => {
    await openBucketAsserted(nats.nc, leaderBucket("stopread"), { history: 1, ttl: 3000 });
    const nc = await nats.connect();
    const subjects = recordRequests(nc);
    const stop = new AbortController();
    stop.abort();
    expect(await new LeaderLeaseReader(nc, "stopread").leader(stop.signal)).toBeUndefined();
    expect(await awaitBucketStore(nc, leaderBucket("stopread"), undefined, stop.signal)).toBe("unprovable");
    expect(subjects).toEqual([]);
    // Not aborted, the same reader reads the lease (nobody leads: null).
    expect(await new LeaderLeaseReader(nc, "stopread").leader()).toBeNull();
    expect(subjects.some((s) => s.startsWith("$JS.API.STREAM.MSG.GET."))).toBe(true);
  });
});
