import { Bucket, type KV } from "@nats-io/kv";
import type { Status } from "@nats-io/transport-node";
import { afterEach, describe, expect, it, vi } from "vitest";
import { WatchedMemberRegistry } from "../../../coordinator/membership/watched-member-registry.js";
import type { KvMemberRegistry } from "../../../coordinator/membership/member-registry.js";
import { CheckpointError, MEMBER_HEARTBEAT_MS, MEMBER_TTL_MS, type Member } from "../../../protocol/index.js";
import { refusalOf } from "../../support/refusal.js";
import { TestClock } from "./fake-participants.js";

type Read = Awaited<ReturnType<KvMemberRegistry["read"]>>;

interface RegistryInternals {
  lostAt: number | undefined;
  readBucket(): Promise<Read>;
  reseedAfterReconnect(): Promise<void>;
  followConnection(): void;
  rewatch(): Promise<void>;
  remember(key: string, cached: { member: Member; seenAt: number; revision: number }): void;
}

const member = (instance: string): Member => ({ kind: "model", instance, incarnation: "i1", started_at: 1, heartbeat_at: 1, protocol_version: 1 });
const holding = (...instances: string[]): Read => ({ members: instances.map((instance, i) => ({ member: member(instance), ageMs: 0, revision: i + 1 })), unreadable: [] });

/** Every pause the registry takes, recorded and cut to nothing (the tests do not wait them out). */
function pausesCut(): number[] {
  const delays: number[] = [];
  const realSetTimeout = globalThis.setTimeout;
  vi.spyOn(globalThis, "setTimeout").mockImplementation(((fn: () => void, ms?: number) => {
    delays.push(ms ?? 0);
    return realSetTimeout(fn, 0);
  }) as typeof setTimeout);
  return delays;
}

function registry(clock = new TestClock()) {
  const watched = new WatchedMemberRegistry({} as KV, undefined, clock);
  return { watched, internals: watched as unknown as RegistryInternals, clock };
}

/** Whether `promise` settled within one turn of the event loop (it awaited nothing outstanding). */
async function settlesAtOnce(promise: Promise<unknown>): Promise<boolean> {
  return Promise.race([promise.then(() => true), new Promise<boolean>((resolve) => setImmediate(() => resolve(false)))]);
}

/**
 * A connection's status events, fed by the test to a registry over a stand-in Bucket. `emit`
 * resolves once the registry asked for the next event: the one emitted was handled.
 */
function statusFeed() {
  const queued: Status[] = [];
  let pulled: (() => void) | undefined;
  let arrived: (() => void) | undefined;
  const iterator: AsyncIterableIterator<Status> = {
    [Symbol.asyncIterator]: () => iterator,
    async next() {
      pulled?.();
      while (queued.length === 0) await new Promise<void>((resolve) => (arrived = resolve));
      return { value: queued.shift()!, done: false };
    },
  };
  const connection = { status: () => iterator };
  const kv = Object.assign(Object.create(Bucket.prototype) as Bucket, { jsm: { getConnection: () => connection } });
  const emit = (status: Status) =>
    new Promise<void>((resolve) => {
      pulled = resolve;
      queued.push(status);
      arrived?.();
    });
  return { kv: kv as unknown as KV, emit };
}

afterEach(() => vi.restoreAllMocks());

// After a reconnect the registry reads the bucket again: cut off longer than the TTL its view aged
// every member out. That read failing (JetStream not answering yet right after the reconnect, a
// stream leader being elected) left the view empty until the watch's consumer reset.
describe("membership re-read after a reconnect", () => {
  it("is retried after a failure, with a jittered pause growing per failure, until it succeeds", async () => {
    const delays = pausesCut();
    const { watched, internals, clock } = registry();
    clock.random = () => 0;
    let reads = 0;
    internals.readBucket = async () => {
      reads += 1;
      if (reads < 3) throw new Error("JetStream not available");
      return holding("live");
    };
    try {
      await internals.reseedAfterReconnect();
      expect(reads).toBe(3);
      expect(delays).toEqual([100, 200]);
      expect(await watched.list()).toEqual([{ kind: "model", instance: "live" }]);
    } finally {
      watched.stop();
    }
  });

  // Given up after 6 failures, the view stayed "not current" (lostAt) until the next reconnect,
  // however long: the restore clean-up gave nobody up for good (viewCurrent false).
  it("keeps retrying past 6 failures, its pause capped, until a read succeeds: the view is current again", async () => {
    const delays = pausesCut();
    const { watched, internals, clock } = registry();
    clock.random = () => 0;
    let reads = 0;
    internals.readBucket = async () => {
      reads += 1;
      if (reads <= 8) throw new Error("JetStream not available");
      return holding("live");
    };
    internals.lostAt = clock.monotonic();
    try {
      await internals.reseedAfterReconnect();
      expect(reads).toBe(9);
      expect(delays).toEqual([100, 200, 400, 800, 1_600, 2_500, 2_500, 2_500]);
      expect(watched.viewCurrent()).toBe(true);
      expect(await watched.list()).toEqual([{ kind: "model", instance: "live" }]);
    } finally {
      watched.stop();
    }
  });

  it("stops retrying when the registry stops, its pause cut short", async () => {
    // The pause, taken for real (200 ms): the test goes on once it is.
    let paused!: () => void;
    const pauseTaken = new Promise<void>((resolve) => (paused = resolve));
    const realSetTimeout = globalThis.setTimeout;
    vi.spyOn(globalThis, "setTimeout").mockImplementation(((fn: () => void, ms?: number) => {
      paused();
      return realSetTimeout(fn, ms);
    }) as typeof setTimeout);
    const { watched, internals } = registry();
    let reads = 0;
    internals.readBucket = async () => {
      reads += 1;
      throw new Error("JetStream not available");
    };
    const retrying = internals.reseedAfterReconnect();
    await pauseTaken;
    watched.stop();
    // The pause ends with the stop, and no read follows it.
    expect(await settlesAtOnce(retrying)).toBe(true);
    expect(reads).toBe(1);
  });

  it("takes no pause and no other try after a failure of the attempt in flight when it stopped", async () => {
    const { watched, internals } = registry();
    let reads = 0;
    let fail!: (error: Error) => void;
    let asked!: () => void;
    const readAsked = new Promise<void>((resolve) => (asked = resolve));
    internals.readBucket = () => {
      reads += 1;
      asked();
      return new Promise<Read>((_, reject) => (fail = reject));
    };
    const retrying = internals.reseedAfterReconnect();
    await readAsked;
    watched.stop();
    fail(new Error("connection closed"));
    // A pause taken after stop() (200 ms real time here) would outlive it: nothing ends it.
    expect(await settlesAtOnce(retrying)).toBe(true);
    expect(reads).toBe(1);
  });

  it("stops retrying when a later reconnect reads again", async () => {
    pausesCut();
    const { watched, internals } = registry();
    const reads: string[] = [];
    let failed!: () => void;
    const firstFailure = new Promise<void>((resolve) => (failed = resolve));
    internals.readBucket = async () => {
      reads.push(reads.length === 0 ? "first" : "later");
      if (reads.length === 1) {
        failed();
        throw new Error("JetStream not available");
      }
      return holding("live");
    };
    try {
      const first = internals.reseedAfterReconnect();
      await firstFailure;
      await internals.reseedAfterReconnect();
      await first;
      expect(reads).toEqual(["first", "later"]);
    } finally {
      watched.stop();
    }
  });
});

// A watch opened afresh (the bucket found re-created) has no revision to resume from: the bucket is
// read again, and that read failing left only the members that beat again.
describe("membership read after the watch is opened afresh", () => {
  it("is retried after a failure", async () => {
    pausesCut();
    let end!: () => void;
    const ended = new Promise<void>((resolve) => (end = resolve));
    const quietWatch = {
      stop: () => end(),
      async *[Symbol.asyncIterator]() {
        await ended;
      },
    };
    const watched = new WatchedMemberRegistry({ watch: async () => quietWatch } as unknown as KV, undefined, new TestClock());
    const internals = watched as unknown as RegistryInternals;
    let reads = 0;
    internals.readBucket = async () => {
      reads += 1;
      if (reads < 2) throw new Error("JetStream not available");
      return holding("live");
    };
    try {
      await internals.rewatch();
      expect(reads).toBe(2);
      expect(await watched.list()).toEqual([{ kind: "model", instance: "live" }]);
    } finally {
      watched.stop();
    }
  });
});

describe("listing members while the re-read after a reconnect is in flight", () => {
  // However short the outage, what changed during it is not in the view until the watch's consumer
  // resets: answered from the view, a listing missed a member that joined (a retire, the fence, did
  // not reach it) and still listed one that left (a prepare waited out its probes and failed).
  it("waits for the read after an outage too short for a live member to age out: who joined or left meanwhile is listed as the bucket holds", async () => {
    const { watched, internals, clock } = registry();
    internals.remember("model.live", { member: member("live"), seenAt: clock.monotonic(), revision: 1 });
    internals.remember("model.left", { member: member("left"), seenAt: clock.monotonic(), revision: 2 });
    let answer!: (read: Read) => void;
    internals.readBucket = () => new Promise<Read>((resolve) => (answer = resolve));
    internals.lostAt = clock.monotonic();
    clock.current += 1_000;
    const reseeding = internals.reseedAfterReconnect();
    try {
      const listing = watched.list();
      expect(await settlesAtOnce(listing)).toBe(false);
      expect(watched.viewCurrent()).toBe(false);
      answer(holding("live", "joined"));
      expect((await listing).map((m) => m.instance)).toEqual(["joined", "live"]);
      await reseeding;
      expect(watched.viewCurrent()).toBe(true);
    } finally {
      watched.stop();
    }
  });

  it("waits for the read after an outage long enough for a live member's last beat to age out", async () => {
    const { watched, internals, clock } = registry();
    internals.remember("model.live", { member: member("live"), seenAt: clock.monotonic(), revision: 1 });
    let answer!: (read: Read) => void;
    internals.readBucket = () => new Promise<Read>((resolve) => (answer = resolve));
    internals.lostAt = clock.monotonic();
    clock.current += MEMBER_TTL_MS - MEMBER_HEARTBEAT_MS;
    const reseeding = internals.reseedAfterReconnect();
    try {
      const listing = watched.list();
      expect(await settlesAtOnce(listing)).toBe(false);
      answer(holding("live", "joined"));
      expect((await listing).map((m) => m.instance)).toEqual(["joined", "live"]);
      await reseeding;
      // Read since: the view is current again, nothing to wait for.
      expect(internals.lostAt).toBeUndefined();
    } finally {
      watched.stop();
    }
  });
});

describe("listing members after the connection was lost again while the re-read was in flight", () => {
  it("waits for the next re-read once that outage is long enough, though the earlier read succeeded", async () => {
    const { kv, emit } = statusFeed();
    const clock = new TestClock();
    const watched = new WatchedMemberRegistry(kv, undefined, clock);
    const internals = watched as unknown as RegistryInternals;
    const answers: ((read: Read) => void)[] = [];
    let asked!: () => void;
    let readAsked = new Promise<void>((resolve) => (asked = resolve));
    internals.readBucket = () =>
      new Promise<Read>((resolve) => {
        answers.push(resolve);
        asked();
      });
    internals.followConnection();
    try {
      await emit({ type: "disconnect", server: "127.0.0.1:4222" } as Status);
      // What the reconnect runs, awaited here: that read is over before the next reconnect.
      const firstRead = internals.reseedAfterReconnect();
      await readAsked;
      // Lost again before that read's answer came (its requests were answered just before).
      await emit({ type: "disconnect", server: "127.0.0.1:4222" } as Status);
      answers[0]!(holding("live"));
      await firstRead;
      // Long enough that "live" ages out of the view unless a read after the reconnect shows it.
      clock.current += MEMBER_TTL_MS;
      readAsked = new Promise<void>((resolve) => (asked = resolve));
      await emit({ type: "reconnect", server: "127.0.0.1:4222" } as Status);
      await readAsked;
      const listing = watched.list();
      // The view is not current: the read after this reconnect is waited for, not an empty view answered.
      expect(await settlesAtOnce(listing)).toBe(false);
      answers[1]!(holding("live"));
      expect(await listing).toEqual([{ kind: "model", instance: "live" }]);
    } finally {
      watched.stop();
    }
  });
});

// The bucket's config is asserted again before each such read, as the coordinator's start does.
describe("the members bucket's config, asserted again after a reconnect", () => {
  it("refuses listings with what the assertion refused, until an assertion passes", async () => {
    pausesCut();
    let refusal: CheckpointError | undefined = new CheckpointError("invalid_request", "KV bucket gym_ckpt_d_members is kept in memory storage");
    let asserts = 0;
    const assertBucket = async () => {
      asserts += 1;
      if (refusal) throw refusal;
    };
    const watched = new WatchedMemberRegistry({} as KV, undefined, new TestClock(), MEMBER_TTL_MS, MEMBER_HEARTBEAT_MS, assertBucket);
    const internals = watched as unknown as RegistryInternals;
    internals.readBucket = async () => holding("live");
    try {
      await internals.reseedAfterReconnect();
      expect(asserts).toBe(1); // not retried: only a bucket re-created again can change it
      expect((await refusalOf(watched.list())).code).toBe("invalid_request");
      expect((await refusalOf(watched.unreadable())).code).toBe("invalid_request");
      refusal = undefined;
      await internals.reseedAfterReconnect();
      expect(await watched.list()).toEqual([{ kind: "model", instance: "live" }]);
    } finally {
      watched.stop();
    }
  });

  it("lets listings through once the bucket is fixed in place, with no reconnect or re-creation", async () => {
    pausesCut();
    let refusal: CheckpointError | undefined = new CheckpointError("invalid_request", "KV bucket gym_ckpt_d_members also takes in subject(s) stray.>");
    const assertBucket = async () => {
      if (refusal) throw refusal;
    };
    const watched = new WatchedMemberRegistry({} as KV, undefined, new TestClock(), MEMBER_TTL_MS, MEMBER_HEARTBEAT_MS, assertBucket);
    const internals = watched as unknown as RegistryInternals;
    internals.readBucket = async () => holding("live");
    try {
      await internals.reseedAfterReconnect();
      expect((await refusalOf(watched.list())).code).toBe("invalid_request");
      refusal = undefined; // `nats stream edit` dropped the stray subject
      expect(await watched.list()).toEqual([{ kind: "model", instance: "live" }]);
      expect(await watched.unreadable()).toEqual([]);
    } finally {
      watched.stop();
    }
  });

  // Each listing asserted again on its own: a burst of listings (every prepare and status while
  // refused) sent as many stream-info requests at once.
  it("shares one assertion in flight among the listings that ask while refused", async () => {
    pausesCut();
    const refusal = new CheckpointError("invalid_request", "KV bucket gym_ckpt_d_members is kept in memory storage");
    let asserts = 0;
    let answer: (() => void) | undefined;
    const assertBucket = async () => {
      asserts += 1;
      if (asserts > 1) await new Promise<void>((resolve) => (answer = resolve));
      throw refusal;
    };
    const watched = new WatchedMemberRegistry({} as KV, undefined, new TestClock(), MEMBER_TTL_MS, MEMBER_HEARTBEAT_MS, assertBucket);
    const internals = watched as unknown as RegistryInternals;
    internals.readBucket = async () => holding("live");
    try {
      await internals.reseedAfterReconnect();
      expect(asserts).toBe(1);
      const listings = [watched.list(), watched.list(), watched.unreadable()].map((listing) => refusalOf(listing));
      expect(await settlesAtOnce(Promise.all(listings))).toBe(false);
      expect(asserts).toBe(2);
      answer!();
      answer = undefined;
      expect((await Promise.all(listings)).map((r) => r.code)).toEqual(["invalid_request", "invalid_request", "invalid_request"]);
      // Over: the next listing asserts again.
      const later = refusalOf(watched.list());
      await vi.waitFor(() => expect(answer).toBeDefined());
      expect(asserts).toBe(3);
      answer!();
      expect((await later).code).toBe("invalid_request");
    } finally {
      watched.stop();
    }
  });

  it("keeps refusing listings when asserting again fails otherwise (NATS not answering)", async () => {
    pausesCut();
    let failure: Error = new CheckpointError("invalid_request", "KV bucket gym_ckpt_d_members is sealed");
    const assertBucket = async () => {
      throw failure;
    };
    const watched = new WatchedMemberRegistry({} as KV, undefined, new TestClock(), MEMBER_TTL_MS, MEMBER_HEARTBEAT_MS, assertBucket);
    const internals = watched as unknown as RegistryInternals;
    internals.readBucket = async () => holding("live");
    try {
      await internals.reseedAfterReconnect();
      failure = new Error("TIMEOUT");
      expect((await refusalOf(watched.list())).code).toBe("invalid_request");
    } finally {
      watched.stop();
    }
  });

  it("retries the read when the assertion fails otherwise (NATS not answering)", async () => {
    pausesCut();
    let asserts = 0;
    const assertBucket = async () => {
      asserts += 1;
      if (asserts === 1) throw new Error("TIMEOUT");
    };
    const watched = new WatchedMemberRegistry({} as KV, undefined, new TestClock(), MEMBER_TTL_MS, MEMBER_HEARTBEAT_MS, assertBucket);
    const internals = watched as unknown as RegistryInternals;
    internals.readBucket = async () => holding("live");
    try {
      await internals.reseedAfterReconnect();
      expect(asserts).toBe(2);
      expect(await watched.list()).toEqual([{ kind: "model", instance: "live" }]);
    } finally {
      watched.stop();
    }
  });
});
