import { afterEach, describe, expect, it, vi } from "vitest";

// The heartbeat's recovery logic in isolation (a fake KV manager): a put that fails drops the
// bucket handle, so the next beat creates the bucket again instead of failing forever; a refused
// compare-and-set reads the entry from the stream leader, and only another incarnation there
// counts as a takeover.
const kvm = vi.hoisted(() => ({
  creates: 0,
  puts: [] as string[],
  failNextPut: false,
  /** The next this many writes fail (NATS unreachable). */
  failPuts: 0,
  /** The next this many writes go unanswered: nats.js gives up on each after its request timeout. */
  hangPuts: 0,
  /** NATS unreachable: every write and bucket create goes unanswered until its request timeout. */
  outage: false,
  /** Requests waiting for their timeout now, and the most seen at once. */
  inFlight: 0,
  peakInFlight: 0,
  /** The timeout of each write that went unanswered. */
  hungTimeouts: [] as number[],
  /** The timeout of each delete that went unanswered. */
  hungDeleteTimeouts: [] as number[],
  /** When (fake time) each write landed. */
  landedAt: [] as number[],
  /** The next write is refused as a compare-and-set on a stale revision. */
  wrongRevisionNext: false,
  /** What a direct get (any replica, possibly lagging) answers. */
  replicaEntry: null as null | { incarnation: string },
  /** What the stream leader holds for the key. */
  leaderEntry: null as null | { seq: number; incarnation: string; at?: number },
}));
/** nats.js' default JetStream request timeout. */
const DEFAULT_TIMEOUT_MS = 5_000;
/** A request nobody answers: it fails once its timeout passes. */
const unanswered = async (timeout: number) => {
  kvm.inFlight += 1;
  kvm.peakInFlight = Math.max(kvm.peakInFlight, kvm.inFlight);
  await new Promise((resolve) => setTimeout(resolve, timeout));
  kvm.inFlight -= 1;
  throw new Error("TIMEOUT");
};
vi.mock("@nats-io/kv", () => ({
  Kvm: class {
    /** The request timeout of the JetStream context it was given (a connection: nats.js' default). */
    private readonly timeout: number;
    constructor(js: { timeout?: number }) {
      this.timeout = js.timeout ?? DEFAULT_TIMEOUT_MS;
    }
    async create() {
      if (kvm.outage) await unanswered(this.timeout);
      kvm.creates += 1;
      return this.handle();
    }
    /** Binds to the bucket: no request (the announcer's JetStream context checks no API first). */
    async open() {
      return this.handle();
    }
    private handle() {
      let revision = 0;
      const write = async (key: string, _value: string, opts: { timeout?: number }) => {
        const timeout = opts.timeout ?? this.timeout;
        if (kvm.failPuts > 0) {
          kvm.failPuts -= 1;
          throw new Error("TIMEOUT");
        }
        if (kvm.hangPuts > 0 || kvm.outage) {
          kvm.hangPuts = Math.max(0, kvm.hangPuts - 1);
          kvm.hungTimeouts.push(timeout);
          await unanswered(timeout);
        }
        if (kvm.failNextPut) {
          kvm.failNextPut = false;
          throw new Error("stream not found");
        }
        if (kvm.wrongRevisionNext) {
          kvm.wrongRevisionNext = false;
          throw Object.assign(new Error("wrong last sequence: 7"), { code: 10071 });
        }
        kvm.puts.push(key);
        kvm.landedAt.push(Date.now());
        return ++revision;
      };
      const get = async () => (kvm.replicaEntry ? { operation: "PUT", revision: 1, json: () => member(kvm.replicaEntry!.incarnation) } : null);
      // create()'s and update()'s requests as nats.js sends them (create takes no timeout).
      const create = (key: string, value: string) => write(key, value, {});
      const update = (key: string, value: string, _revision: number, timeout?: number) => write(key, value, { timeout });
      // kv.delete() takes no timeout: its JetStream context's.
      const remove = async () => {
        if (kvm.outage) {
          kvm.hungDeleteTimeouts.push(this.timeout);
          await unanswered(this.timeout);
        }
      };
      return { get, put: write, create, update, delete: remove };
    }
  },
}));
vi.mock("@nats-io/jetstream", () => {
  const jetstreamManager = async () => ({
    streams: {
      getMessage: async () => (kvm.leaderEntry ? { seq: kvm.leaderEntry.seq, header: undefined, json: () => member(kvm.leaderEntry!.incarnation, kvm.leaderEntry!.at) } : null),
    },
  });
  return { jetstream: (_nc: unknown, opts: { timeout?: number }) => ({ timeout: opts.timeout, jetstreamManager }), jetstreamManager };
});
const member = (incarnation: string, at?: number) => ({ kind: "environment", instance: "env0", incarnation, started_at: at ?? 1, heartbeat_at: at ?? 2, protocol_version: 1 });

const { NoRespondersError } = await import("@nats-io/transport-node");
// The claim probes the participant's status subject first: nobody else answers. No reconnects.
const noResponders = {
  requestMany: async (subject: string) => Promise.reject(new NoRespondersError(subject)),
  status: () => ({ async *[Symbol.asyncIterator]() {} }),
} as never;
const { BEAT_REQUEST_MIN_TIMEOUT_MS, MembershipAnnouncer, STOP_DELETE_WAIT_MS } = await import("../../../participants/control-plane/membership-announcer.js");
const { MEMBER_HEARTBEAT_MS, MEMBER_TTL_MS } = await import("../../../protocol/index.js");
/** Whether `promise` settled by the time it is read (advanceTimersByTimeAsync flushes microtasks). */
const watch = (promise: Promise<unknown>) => {
  const state = { settled: false };
  void promise.then(() => (state.settled = true));
  return state;
};

afterEach(() => {
  vi.useRealTimers();
  Object.assign(kvm, { creates: 0, puts: [], landedAt: [], failNextPut: false, failPuts: 0, hangPuts: 0, outage: false, inFlight: 0, peakInFlight: 0, hungTimeouts: [], hungDeleteTimeouts: [], wrongRevisionNext: false, replicaEntry: null, leaderEntry: null });
});

describe("membership heartbeat", () => {
  it("re-creates the members bucket after a failed beat (deleted bucket, NATS back without its store)", async () => {
    vi.useFakeTimers();
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, 100);
    await announcer.start();
    expect([kvm.creates, kvm.puts.length]).toEqual([1, 1]);
    kvm.failNextPut = true; // the bucket was deleted
    await vi.advanceTimersByTimeAsync(100);
    expect(kvm.puts.length).toBe(1);
    await vi.advanceTimersByTimeAsync(100);
    expect(kvm.creates).toBe(2); // created again, and announced again
    expect(kvm.puts).toEqual(["environment.env0", "environment.env0"]);
    await announcer.stop();
  });

  it("a refused compare-and-set with another incarnation at the stream leader: lost (instance_conflict), no more beats", async () => {
    vi.useFakeTimers();
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, 100);
    await announcer.start();
    const lost = watch(announcer.lost);
    kvm.wrongRevisionNext = true;
    kvm.leaderEntry = { seq: 9, incarnation: "inc-2" };
    await vi.advanceTimersByTimeAsync(100);
    expect(lost.settled).toBe(true);
    expect((await announcer.lost).code).toBe("instance_conflict");
    await vi.advanceTimersByTimeAsync(500);
    expect(kvm.puts).toHaveLength(1);
    await announcer.stop();
  });

  it("a replica's lagging copy showing another incarnation is not a takeover: the leader's entry is ours, so it announces on", async () => {
    vi.useFakeTimers();
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, 100);
    await announcer.start();
    const lost = watch(announcer.lost);
    kvm.wrongRevisionNext = true; // our own write landed but its acknowledgement was lost, say
    kvm.replicaEntry = { incarnation: "inc-0" }; // the predecessor this process took over from
    kvm.leaderEntry = { seq: 9, incarnation: "inc-1" };
    await vi.advanceTimersByTimeAsync(100);
    expect(kvm.puts).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(300);
    expect(kvm.puts).toHaveLength(5);
    expect(lost.settled).toBe(false);
    await announcer.stop();
  });
});

describe("a put NATS is slow to answer (a slow JetStream, a reconnect)", () => {
  // Before, a beat waited for its put (up to nats.js' 5 s JetStream timeout) and every tick
  // meanwhile was skipped: one unanswered put left the entry unrefreshed for 15 s, the bucket's
  // TTL, and the coordinator reported a live participant unreachable.
  it("is given up after one heartbeat period: the next beat runs on time and the entry is refreshed well within the TTL", async () => {
    vi.useFakeTimers();
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1");
    await announcer.start();
    const startedAt = Date.now();
    kvm.hangPuts = 1;
    await vi.advanceTimersByTimeAsync(6 * MEMBER_HEARTBEAT_MS);
    const landed = [startedAt, ...kvm.landedAt.slice(1)];
    const gaps = landed.slice(1).map((at, i) => at - landed[i]!);
    // One beat lost, no more: its successor lands on its own tick.
    expect(Math.max(...gaps)).toBeLessThanOrEqual(2 * MEMBER_HEARTBEAT_MS);
    expect(Math.max(...gaps)).toBeLessThan(MEMBER_TTL_MS);
    expect(kvm.landedAt.length).toBeGreaterThanOrEqual(5);
    await announcer.stop();
  });

  // Before, a beat's requests waited nats.js' default 5 s though the beat was given up after a
  // period: with a 100 ms period an outage kept some 50 of them in flight.
  it("in an outage, a beat's requests wait max(period, 1 s): with a short period few are in flight at once", async () => {
    vi.useFakeTimers();
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, 100);
    await announcer.start();
    kvm.outage = true;
    await vi.advanceTimersByTimeAsync(10_000);
    // A beat (one request) per period, each waiting 1 s.
    expect(kvm.peakInFlight).toBeGreaterThanOrEqual(5);
    expect(kvm.peakInFlight).toBeLessThanOrEqual(BEAT_REQUEST_MIN_TIMEOUT_MS / 100 + 1);
    expect(new Set(kvm.hungTimeouts)).toEqual(new Set([BEAT_REQUEST_MIN_TIMEOUT_MS]));
    kvm.outage = false;
    await vi.advanceTimersByTimeAsync(BEAT_REQUEST_MIN_TIMEOUT_MS + 200);
    expect(kvm.inFlight).toBe(0);
    expect(kvm.puts.length).toBeGreaterThan(1); // announcing again
    await announcer.stop();
  });

  it("a beat's requests wait a period when that is longer than 1 s; start-up's wait nats.js' default", async () => {
    vi.useFakeTimers();
    kvm.hangPuts = 1;
    const refused = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, 100).start().catch((error: unknown) => error);
    await vi.advanceTimersByTimeAsync(DEFAULT_TIMEOUT_MS);
    expect(await refused).toMatchObject({ message: "TIMEOUT" });
    expect(kvm.hungTimeouts).toEqual([DEFAULT_TIMEOUT_MS]);
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-2", undefined, 2_000);
    await announcer.start();
    kvm.hangPuts = 1;
    await vi.advanceTimersByTimeAsync(2_000);
    expect(kvm.hungTimeouts).toEqual([DEFAULT_TIMEOUT_MS, 2_000]);
    await announcer.stop();
  });

  it("overtaken by a reconnect's beat, its late failure records nothing: the bucket handle stays, nothing is logged", async () => {
    vi.useFakeTimers();
    const lines: { msg: string }[] = [];
    const { pino } = await import("pino");
    const logger = pino({ level: "debug" }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg: string }) });
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", logger);
    await announcer.start();
    kvm.hangPuts = 1;
    await vi.advanceTimersByTimeAsync(MEMBER_HEARTBEAT_MS); // a beat whose put goes unanswered
    (announcer as unknown as { tick(reconnected: boolean): void }).tick(true); // NATS back: a beat at once
    await vi.advanceTimersByTimeAsync(0);
    expect(kvm.puts).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(MEMBER_HEARTBEAT_MS); // the hung put times out
    expect(kvm.creates).toBe(1);
    expect(lines.filter((l) => l.msg.startsWith("membership heartbeat failed"))).toEqual([]);
    await announcer.stop();
  });
});

describe("stop() with NATS unreachable", () => {
  // stop() waits STOP_DELETE_WAIT_MS for its delete of the entry, but the delete went through the
  // bucket handle, whose requests wait nats.js' 5 s (or a beat's timeout, when a beat re-created
  // the bucket): the request outlived stop(), into the Gym launcher's grace before SIGKILL.
  it("its delete waits STOP_DELETE_WAIT_MS, no longer than stop() waits for it", async () => {
    vi.useFakeTimers();
    // The start-up's bucket handle (nats.js' default timeout), and one a beat re-created (its 2 s).
    for (const recreatedByBeat of [false, true]) {
      const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", `inc-${recreatedByBeat}`, undefined, 2_000);
      await announcer.start();
      if (recreatedByBeat) {
        kvm.failNextPut = true;
        await vi.advanceTimersByTimeAsync(2 * 2_000);
        expect(kvm.creates).toBe(3);
      }
      kvm.outage = true;
      const stopped = watch(announcer.stop());
      await vi.advanceTimersByTimeAsync(STOP_DELETE_WAIT_MS);
      expect(stopped.settled).toBe(true);
      expect(kvm.inFlight, `handle re-created by a beat: ${recreatedByBeat}`).toBe(0);
      expect(kvm.hungDeleteTimeouts).toEqual([STOP_DELETE_WAIT_MS]);
      kvm.outage = false;
      kvm.hungDeleteTimeouts = [];
    }
  });
});

describe("an entry whose times no Date holds (a corrupt value, a foreign writer's nanoseconds)", () => {
  // The announcer names the entry's times in its refusals (toISOString). Read as a member, such an
  // entry made the claim throw a RangeError (the participant did not start), and made a takeover
  // throw before it told the owner (`lost` never settled: the process served on a name it had lost).
  it("is no member: the claim takes it over, and a beat refused over it writes its own entry again", async () => {
    vi.useFakeTimers();
    kvm.leaderEntry = { seq: 3, incarnation: "foreign", at: 1.765e18 };
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, 100);
    await announcer.start();
    expect(kvm.puts).toEqual(["environment.env0"]);
    const lost = watch(announcer.lost);
    kvm.wrongRevisionNext = true;
    kvm.leaderEntry = { seq: 9, incarnation: "inc-2", at: -1e300 };
    await vi.advanceTimersByTimeAsync(100);
    expect(kvm.puts).toEqual(["environment.env0", "environment.env0"]);
    expect(lost.settled).toBe(false);
    await announcer.stop();
  });
});

describe("heartbeats failing for a while (NATS unreachable)", () => {
  // Before, every failed beat (one per heartbeat period, per participant) logged a warning with
  // its stack for as long as the outage lasted.
  it("warn once, log each further failure at debug, and say once when a beat lands again", async () => {
    vi.useFakeTimers();
    const lines: { level: number; msg: string; failed_tries?: number }[] = [];
    const { pino } = await import("pino");
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as { level: number; msg: string }) });
    const announcer = new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", logger, 100);
    await announcer.start();
    kvm.failPuts = 5;
    await vi.advanceTimersByTimeAsync(100 * 7);
    expect(kvm.puts.length).toBeGreaterThan(1); // announcing again
    const failed = lines.filter((l) => l.msg.startsWith("membership heartbeat failed"));
    expect(failed.map((l) => l.level)).toEqual([40]);
    const back = lines.filter((l) => l.msg.startsWith("membership heartbeat lands again"));
    expect(back).toHaveLength(1);
    expect(back[0]).toMatchObject({ level: 30, failed_tries: 5 });
    await announcer.stop();
  });
});

describe("heartbeat period", () => {
  it("refuses a period the entry would not survive (the bucket drops it MEMBER_TTL_MS after the last beat) or a timer cannot run, with invalid_request", () => {
    const announcer = (ms: number) => () => new MembershipAnnouncer(noResponders, "dep", "environment", "env0", "inc-1", undefined, ms);
    // 20 s: the entry expired 5 s of every 20 and the coordinator left the participant out of checkpoints;
    // 0 or NaN: a beat every millisecond.
    for (const ms of [MEMBER_TTL_MS, 20_000, 0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(announcer(ms), String(ms)).toThrowError(expect.objectContaining({ code: "invalid_request" }));
    }
    for (const ms of [100, MEMBER_HEARTBEAT_MS]) expect(announcer(ms)).not.toThrow();
  });
});
