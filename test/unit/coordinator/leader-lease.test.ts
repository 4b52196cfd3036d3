import type { KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { LeaderLease, type LeaderLeaseOptions } from "../../../coordinator/ha/leader-lease.js";
import type { Clock } from "../../../coordinator/engine/clock.js";
import { MIN_LEASE_MS, PROTOCOL_VERSION } from "../../../protocol/index.js";

/**
 * Timers fire only when the test advances time. Wall and monotonic time advance together; `stepWall`
 * moves the wall clock alone (NTP, VM resume), and timers run on monotonic time, as setTimeout does.
 */
class ManualClock implements Clock {
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private next = 0;
  private mono = 0;
  constructor(public current = 1_000_000) {}
  now(): number {
    return this.current;
  }
  monotonic(): number {
    return this.mono;
  }
  setTimer(fn: () => void, ms: number): () => void {
    const id = this.next++;
    this.timers.push({ at: this.mono + ms, fn, id });
    return () => {
      this.timers = this.timers.filter((t) => t.id !== id);
    };
  }
  async sleep(): Promise<void> {}
  stepWall(ms: number): void {
    this.current += ms;
  }
  async advance(ms: number): Promise<void> {
    const target = this.mono + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.at <= target).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.timers = this.timers.filter((t) => t.id !== due.id);
      this.current += due.at - this.mono;
      this.mono = due.at;
      due.fn();
      for (let i = 0; i < 10; i++) await Promise.resolve();
    }
    this.current += target - this.mono;
    this.mono = target;
  }
}

/** A KV with create/update CAS semantics on one key. */
class FakeKv {
  revision = 100;
  /** The bucket's max_age (ms), as kv.status() reports it. */
  ttl = 3000;
  async status(): Promise<{ ttl: number }> {
    return { ttl: this.ttl };
  }
  holder: number | undefined;
  failUpdates = false;
  /** Updates never answer (a partitioned server): the caller's timeout is all that ends them. */
  hangUpdates = false;
  readonly updateTimeouts: (number | undefined)[] = [];
  /** Every value sent with create or update. */
  readonly values: string[] = [];
  /** Set: a create waits for it before it reaches the server (a campaign in flight). */
  createGate: Promise<void> | undefined;
  async create(_key: string, value: string): Promise<number> {
    this.values.push(value);
    if (this.createGate) await this.createGate;
    if (this.holder !== undefined) throw new Error("wrong last sequence");
    this.holder = ++this.revision;
    this.heldValue = value;
    return this.holder;
  }
  async update(_key: string, value: string, last: number, timeout?: number): Promise<number> {
    this.values.push(value);
    this.updateTimeouts.push(timeout);
    if (this.hangUpdates) return new Promise<number>(() => undefined);
    if (this.failUpdates || this.holder !== last) throw new Error("wrong last sequence");
    this.holder = ++this.revision;
    this.heldValue = value;
    const landed = this.holder;
    // The server applied it; its answer is on the way back.
    if (this.updateGate) await this.updateGate;
    return landed;
  }
  /** Set: an update's answer waits for it (a renewal in flight, already applied by the server). */
  updateGate: Promise<void> | undefined;
  /** The value the key holds (written by the create or update that made `holder`). */
  heldValue = "";
  /** What the key holds now. */
  async get(): Promise<{ operation: "PUT"; revision: number; string: () => string } | null> {
    if (this.holder === undefined) return null;
    const value = this.heldValue;
    return { operation: "PUT", revision: this.holder, string: () => value };
  }
  async delete(_key: string, opts?: { previousSeq?: number }): Promise<void> {
    if (opts?.previousSeq !== undefined && opts.previousSeq !== this.holder) throw new Error("wrong last sequence");
    this.holder = undefined;
  }
}

function lease(kv: FakeKv, clock: ManualClock, events: string[], extra: Partial<LeaderLeaseOptions> = {}) {
  return new LeaderLease({
    nc: {} as NatsConnection,
    deployment: "d",
    id: "me",
    leaseMs: 3000,
    clock,
    kv: kv as unknown as KV,
    onReady: (epoch) => void events.push(`ready:${epoch}`),
    onLost: (epoch) => void events.push(`lost:${epoch}`),
    ...extra,
  });
}

/** A lease started on a fresh fake bucket and clock, with its ready/lost events recorded. */
async function started() {
  const kv = new FakeKv();
  const clock = new ManualClock();
  const events: string[] = [];
  const l = lease(kv, clock, events);
  await l.start();
  return { kv, clock, events, l };
}

describe("leader lease", () => {
  it("refuses a lease period below MIN_LEASE_MS, which the config refuses too: controller clients rely on a new term waiting that long", () => {
    const kv = new FakeKv();
    const lease = (leaseMs: number) => () => new LeaderLease({ nc: {} as NatsConnection, deployment: "d", id: "me", leaseMs, clock: new ManualClock(), kv: kv as unknown as KV });
    expect(lease(MIN_LEASE_MS - 1)).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining(`below ${MIN_LEASE_MS}`) }));
    expect(lease(Number.NaN)).toThrow(expect.objectContaining({ code: "invalid_request" }));
    expect(lease(MIN_LEASE_MS)).not.toThrow();
  });

  it("a campaign the server refuses (not a key another coordinator holds) is logged, once per cause, so a deployment left without a leader says why", async () => {
    const kv = new FakeKv();
    const clock = new ManualClock();
    const logged: { msg: string; err?: { message?: string } }[] = [];
    const logger = pino({ level: "debug" }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string }) });
    const l = new LeaderLease({ nc: {} as NatsConnection, deployment: "d", id: "me", leaseMs: 3000, clock, kv: kv as unknown as KV, logger });
    kv.create = async () => {
      throw new Error("Permissions Violation for Publish to \"$KV.gym_ckpt_d_leader.leader\"");
    };
    await l.start();
    await clock.advance(10_000);
    const failures = () => logged.filter((l) => l.msg === "lease_campaign_failed");
    expect(failures()).toHaveLength(1);
    expect(failures()[0]!.err?.message).toContain("Permissions Violation");
    // Another coordinator holding the key is the normal case: not logged as a failure.
    kv.create = FakeKv.prototype.create.bind(kv);
    kv.holder = 7;
    await clock.advance(10_000);
    expect(failures()).toHaveLength(1);
    // The same refusal coming back after that is a new episode: logged again.
    kv.create = async () => {
      throw new Error("Permissions Violation for Publish to \"$KV.gym_ckpt_d_leader.leader\"");
    };
    await clock.advance(10_000);
    expect(failures()).toHaveLength(2);
    await l.stop(false);
  });

  it("lease_lost and lease_campaign_failed of a timeout say what timed out: which KV op on which bucket and key, its timeout and how long it waited", async () => {
    const kv = new FakeKv();
    const clock = new ManualClock();
    const logged: { msg: string; kv_op?: string; bucket?: string; key?: string; timeout_ms?: number; waited_ms?: number; err?: { message?: string } }[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string }) });
    const l = lease(kv, clock, [], { logger });
    await l.start();
    await clock.advance(3000);
    kv.update = async () => {
      throw new Error("timeout");
    };
    await clock.advance(1000);
    expect(l.state().leader).toBe(false);
    expect(logged.find((line) => line.msg === "lease_lost")).toMatchObject({ kv_op: "update", bucket: "gym_ckpt_d_leader", key: "coordinator", timeout_ms: expect.any(Number), waited_ms: expect.any(Number), err: { message: "timeout" } });
    kv.holder = undefined;
    kv.create = async () => {
      throw new Error("timeout");
    };
    await clock.advance(1000);
    expect(logged.find((line) => line.msg === "lease_campaign_failed")).toMatchObject({ kv_op: "create", bucket: "gym_ckpt_d_leader", key: "coordinator", waited_ms: expect.any(Number), err: { message: "timeout" } });
    await l.stop(false);
  });

  it("does not lead while the bucket's lease is shorter than its own (another coordinator lowered lease_ms since it started): the key would expire while it still acted", async () => {
    const kv = new FakeKv();
    kv.ttl = 1000;
    const clock = new ManualClock();
    const logged: { msg: string; err?: { message?: string } }[] = [];
    const logger = pino({ level: "debug" }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string }) });
    const l = lease(kv, clock, [], { logger });
    await l.start();
    // Before: it led, acting for 3 s after each renewal while its key expired after 1 s, so a
    // successor could be ready (2 s) while it still acted.
    expect(l.state().leader).toBe(false);
    expect(kv.holder).toBeUndefined();
    expect(logged.find((e) => e.msg === "lease_campaign_failed")?.err?.message).toMatch(/1000 ms.*lease_ms 3000/);
    kv.ttl = 3000;
    await clock.advance(750);
    expect(l.state().leader).toBe(true);
    await l.stop();
  });

  it("wins with create (revision = epoch), waits one lease period before it is ready, renews with update", async () => {
    const { kv, clock, events, l } = await started();
    expect(l.state()).toMatchObject({ leader: true, ready: false, epoch: 101 });
    expect(() => l.epoch()).toThrow(/first lease period/);
    await clock.advance(2999);
    expect(l.state().ready).toBe(false);
    await clock.advance(1);
    expect(l.state().ready).toBe(true);
    expect(l.epoch()).toBe(101);
    expect(events).toEqual(["ready:101"]);
    expect(kv.revision).toBeGreaterThan(101);
    // the epoch stays the winning revision while renewals move the key's revision on
    await clock.advance(10_000);
    expect(l.epoch()).toBe(101);
  });

  it("campaignNow while the timer's next campaign comes due keeps one renewal loop (two would race their renewals on one revision and demote the new leader)", async () => {
    const kv = new FakeKv();
    kv.holder = 7; // another coordinator leads
    const clock = new ManualClock();
    const events: string[] = [];
    const l = lease(kv, clock, events);
    await l.start();
    expect(l.state().leader).toBe(false);
    let open!: () => void;
    kv.createGate = new Promise<void>((resolve) => (open = resolve));
    const campaigning = l.campaignNow();
    // The timer's campaign (every lease/4) comes due while campaignNow's create is in flight.
    await clock.advance(1000);
    kv.holder = undefined; // the other leader released the key
    kv.createGate = undefined;
    open();
    expect(await campaigning).toBe(true);
    // One loop renews every lease/3: 20 renewals in 20 s (two loops would send 40, racing on one revision).
    const sent = kv.values.length;
    await clock.advance(20_000);
    expect(kv.values.length - sent).toBeLessThanOrEqual(21);
    expect(events).toEqual([expect.stringMatching(/^ready:/)]);
    expect(l.state()).toMatchObject({ leader: true, ready: true });
    await l.stop();
  });

  it("the key names the term (kept by its renewals, new for the next one) and says once the term serves (markServing writes it at once)", async () => {
    const { kv, clock, l } = await started();
    const written = () => JSON.parse(kv.values.at(-1)!) as { term: string; serving: boolean; epoch: number | null };
    const first = written();
    expect(first.serving).toBe(false);
    expect(first.epoch).toBeNull(); // the create: its revision is the epoch (a restarted participant's floor)
    await clock.advance(3000);
    expect(written()).toMatchObject({ term: first.term, serving: false, epoch: 101 });
    expect(l.state().serving).toBe(false);
    const sent = kv.values.length;
    await l.markServing(101);
    expect(kv.values.length).toBe(sent + 1); // not at the next renewal, a lease/3 later
    expect(written()).toMatchObject({ term: first.term, serving: true });
    // Its state says so too (the HTTP API's /readyz names a term that served, see HEADER_COORDINATOR_SERVED).
    expect(l.state().serving).toBe(true);
    await clock.advance(1000);
    expect(written()).toMatchObject({ term: first.term, serving: true });
    // lost, then won again: a new term that serves nothing yet
    kv.failUpdates = true;
    await clock.advance(1000);
    kv.failUpdates = false;
    kv.holder = undefined;
    await clock.advance(1000);
    expect(l.state().leader).toBe(true);
    expect(written().serving).toBe(false);
    expect(l.state().serving).toBe(false);
    expect(written().term).not.toBe(first.term);
    // A mark for a term that is over writes nothing.
    const now = kv.values.length;
    await l.markServing(101);
    expect(kv.values.length).toBe(now);
    await l.stop();
  });

  it("demotes at the first failed renewal and then campaigns as a follower", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(3000);
    kv.failUpdates = true;
    await clock.advance(1000);
    expect(l.state()).toMatchObject({ leader: false, ready: false, epoch: null });
    expect(events).toEqual(["ready:101", "lost:101"]);
    expect(() => l.epoch()).toThrow(/does not hold/);
    expect(() => l.assert(101)).toThrow();
    // someone else holds the key: campaigns fail until it is gone
    kv.failUpdates = false;
    await clock.advance(5000);
    expect(l.state().leader).toBe(false);
    kv.holder = undefined;
    await clock.advance(1000);
    expect(l.state()).toMatchObject({ leader: true, ready: false });
    expect(l.state().epoch).toBeGreaterThan(101);
    await l.stop();
  });

  it("a renewal that timed out but landed keeps the lease (demoted, the key it wrote would refuse every create, its own too, until it expired); one that did not land still demotes", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(3000);
    // The server applies the next renewal; its answer is lost (the request times out).
    let lose = true;
    kv.update = async function (this: FakeKv, key: string, value: string, last: number, timeout?: number) {
      const landed = await FakeKv.prototype.update.call(this, key, value, last, timeout);
      if (!lose) return landed;
      lose = false;
      throw new Error("TimeoutError: timeout");
    };
    await clock.advance(1000);
    // Before: lost:101, the key held at the landed revision by nobody, every campaign refused.
    expect(events).toEqual(["ready:101"]);
    expect(l.state()).toMatchObject({ leader: true, ready: true, epoch: 101 });
    const held = kv.holder;
    await clock.advance(1000); // the next renewal names the landed revision
    expect(kv.holder).toBeGreaterThan(held!);
    expect(l.epoch()).toBe(101);
    // A renewal that times out without landing demotes as before.
    kv.update = async () => {
      throw new Error("TimeoutError: timeout");
    };
    await clock.advance(1000);
    expect(events).toEqual(["ready:101", "lost:101"]);
    await l.stop();
  });

  it("a campaign whose create timed out but landed releases that key: held by nobody who leads, it would refuse every create (its own too) until it expired", async () => {
    const kv = new FakeKv();
    const clock = new ManualClock();
    const events: string[] = [];
    let lose = true;
    kv.create = async function (this: FakeKv, key: string, value: string) {
      const created = await FakeKv.prototype.create.call(this, key, value);
      if (!lose) return created;
      lose = false;
      throw new Error("TimeoutError: timeout");
    };
    const l = lease(kv, clock, events);
    await l.start();
    expect(l.state().leader).toBe(false);
    // Before: the key stayed at 101 (the fake never expires it), and every later campaign was refused.
    expect(kv.holder).toBeUndefined();
    await clock.advance(750); // the next campaign, a quarter lease later
    expect(l.state()).toMatchObject({ leader: true, epoch: 102 });
    await l.stop();
  });

  it("a renewal that went unanswered and landed only after it was read back is released by the next campaign, or by stop: no key left held by nobody who leads", async () => {
    for (const end of ["campaign", "stop"] as const) {
      const { kv, clock, events, l } = await started();
      await clock.advance(3000);
      // The next renewal's answer is lost and the read-back finds the key as it was; the server applies it later.
      let late: (() => void) | undefined;
      kv.update = async function (this: FakeKv, _key: string, value: string, last: number) {
        late = () => {
          if (this.holder !== last) return;
          this.holder = ++this.revision;
          this.heldValue = value;
        };
        throw new Error("TimeoutError: timeout");
      };
      await clock.advance(1000);
      expect(events).toEqual(["ready:101", "lost:101"]);
      late!();
      const held = kv.holder;
      if (end === "stop") {
        await l.stop();
        // Before: stop released nothing (it did not lead), and the key stayed at the late revision.
        expect(kv.holder).toBeUndefined();
        continue;
      }
      await clock.advance(750); // a campaign, refused: the key holds the late renewal, which it deletes
      expect(kv.holder).toBeUndefined();
      await clock.advance(750); // the next one wins. Before: refused for as long as the key lived.
      expect(l.state()).toMatchObject({ leader: true });
      expect(l.state().epoch).toBeGreaterThan(held!);
      await l.stop();
    }
  });

  it("a renewal that fails at once without a refusal (a 503 while JetStream elects its stream leader) leaves the key held by nobody who leads: the next campaign that finds it releases it", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(3000);
    kv.update = async () => {
      throw new Error("503 no responders");
    };
    await clock.advance(1000);
    expect(events).toEqual(["ready:101", "lost:101"]);
    // The key still holds the last renewal that landed, for most of a lease (the fake never expires it).
    const held = kv.holder;
    expect(held).toBeGreaterThan(101);
    await clock.advance(750); // a campaign, refused: the key is its own left-behind, which it deletes
    expect(kv.holder).toBeUndefined();
    await clock.advance(750); // before: refused for as long as the key lived
    expect(l.state()).toMatchObject({ leader: true });
    expect(l.state().epoch).toBeGreaterThan(held!);
    await l.stop();
  });

  it("a renewal's left-behind key is still released after a campaign in between failed without a refusal too (JetStream or the connection still down): the next campaign that finds it held deletes it", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(3000);
    const create = kv.create.bind(kv);
    const get = kv.get.bind(kv);
    kv.update = async () => {
      throw new Error("503 no responders");
    };
    await clock.advance(1000);
    expect(events).toEqual(["ready:101", "lost:101"]);
    // The key still holds the last renewal that landed (the fake never expires it).
    const held = kv.holder;
    expect(held).toBeGreaterThan(101);
    // The next campaign gets no answer either, nor does its read-back: its create did not land.
    kv.create = async () => {
      throw new Error("503 no responders");
    };
    kv.get = async () => {
      throw new Error("503 no responders");
    };
    await clock.advance(750);
    expect(kv.holder).toBe(held);
    // JetStream answers again: the next campaign is refused by the key its last renewal left behind, which it deletes.
    kv.create = create;
    kv.get = get;
    await clock.advance(750);
    expect(kv.holder).toBeUndefined(); // before the fix: still held by that renewal until it expired
    await clock.advance(750);
    expect(l.state()).toMatchObject({ leader: true });
    expect(l.state().epoch).toBeGreaterThan(held!);
    await l.stop();
  });

  it("stopping while a renewal is in flight still releases the key, so a successor need not wait for its expiry", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(3000);
    let land!: () => void;
    kv.updateGate = new Promise<void>((resolve) => (land = resolve));
    await clock.advance(1000); // the next renewal is sent and waits for its answer
    const stopping = l.stop();
    land();
    await stopping;
    expect(kv.holder).toBeUndefined();
    expect(events).toEqual(["ready:101", "lost:101"]);
    expect(l.state()).toMatchObject({ leader: false, epoch: null });
  });

  it("stopped while the renewal that makes it ready is in flight, it never announces leadership (onReady): only the release's lost", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(2999);
    let land!: () => void;
    kv.updateGate = new Promise<void>((resolve) => (land = resolve));
    await clock.advance(1); // the first lease period is out: its renewal is sent, ready fires once it lands
    const stopping = l.stop();
    land();
    await stopping;
    // Before: ["ready:101", "lost:101"], the daemon's recovery started by a stopped coordinator.
    expect(events).toEqual(["lost:101"]);
    expect(kv.holder).toBeUndefined();
  });

  it("a campaign that cannot lead with the key it created (its epoch floor failed, or the purge past it) releases it: no coordinator is kept from leading until the key expires", async () => {
    const kv = new FakeKv();
    const clock = new ManualClock();
    let floor: () => Promise<number> = async () => {
      throw new Error("checkpoint root unreadable");
    };
    const l = new LeaderLease({ nc: {} as NatsConnection, deployment: "d", id: "me", leaseMs: 3000, clock, kv: kv as unknown as KV, epochFloor: () => floor() });
    await l.start();
    expect(l.state().leader).toBe(false);
    // Before: the key created at 101 stayed held by nobody who leads, refusing every create for a lease.
    expect(kv.holder).toBeUndefined();
    // A floor above the revision needs a purge, which fails here (no JetStream behind this connection).
    floor = async () => 1_000;
    await clock.advance(750);
    expect(l.state().leader).toBe(false);
    expect(kv.holder).toBeUndefined();
    // The next campaign (a lease/4 later), its floor now met, wins at once rather than a lease later.
    floor = async () => 0;
    await clock.advance(750);
    expect(l.state()).toMatchObject({ leader: true });
    expect(kv.holder).toBe(l.state().epoch);
    await l.stop();
  });

  it("after a purge past the epoch floor, the key's lease runs from the create that made it, not from the campaign's first create: a slow floor and purge do not cost the new leader its first renewal", async () => {
    const kv = new FakeKv();
    const clock = new ManualClock();
    const events: string[] = [];
    // A renewal answers in 5 ms: one given less than that times out (the lease gives it what is left of the lease).
    kv.update = async function (this: FakeKv, key: string, value: string, last: number, timeout?: number) {
      if (timeout !== undefined && timeout < 5) {
        this.updateTimeouts.push(timeout);
        throw new Error("TimeoutError: timeout");
      }
      return FakeKv.prototype.update.call(this, key, value, last, timeout);
    };
    // Just enough of JetStream for the purge: it empties the key and moves the sequence, and is slow.
    const nc = {
      options: { inboxPrefix: "_INBOX" },
      request: async (subject: string, data: Uint8Array) => {
        let reply: unknown = {};
        if (subject.startsWith("$JS.API.STREAM.PURGE.")) {
          const { seq } = JSON.parse(new TextDecoder().decode(data)) as { seq: number };
          await clock.advance(1_300);
          kv.holder = undefined;
          kv.revision = seq - 1;
          reply = { success: true, purged: 1 };
        }
        return { data: new TextEncoder().encode(JSON.stringify(reply)) };
      },
    } as unknown as NatsConnection;
    const l = lease(kv, clock, events, {
      nc,
      // The daemon's probe takes up to a quarter lease.
      epochFloor: async () => {
        await clock.advance(750);
        return 1_000;
      },
    });
    await l.start();
    expect(l.state()).toMatchObject({ leader: true, epoch: 1_001 });
    // Created at 2050 (monotonic), first renewed at 3050: before, the lease counted from the first
    // create (0), gave that renewal 1 ms, and the new leader was lost (lost:1001) under a live key.
    await clock.advance(6_000);
    expect(events).toEqual(["ready:1001"]);
    expect(Math.min(...kv.updateTimeouts.map((t) => t ?? Infinity))).toBeGreaterThan(1_000);
    await l.stop();
  });

  it("the create past the epoch floor, timed out but landed, is released too: the next campaign wins instead of every create being refused until it expired", async () => {
    const kv = new FakeKv();
    const clock = new ManualClock();
    const events: string[] = [];
    // Just enough of JetStream for the purge: it empties the key and moves the sequence.
    const nc = {
      options: { inboxPrefix: "_INBOX" },
      request: async (subject: string, data: Uint8Array) => {
        let reply: unknown = {};
        if (subject.startsWith("$JS.API.STREAM.PURGE.")) {
          const { seq } = JSON.parse(new TextDecoder().decode(data)) as { seq: number };
          kv.holder = undefined;
          kv.revision = seq - 1;
          reply = { success: true, purged: 1 };
        }
        return { data: new TextEncoder().encode(JSON.stringify(reply)) };
      },
    } as unknown as NatsConnection;
    // The create after the purge lands; its answer is lost.
    let creates = 0;
    kv.create = async function (this: FakeKv, key: string, value: string) {
      const created = await FakeKv.prototype.create.call(this, key, value);
      if (++creates === 2) throw new Error("TimeoutError: timeout");
      return created;
    };
    const l = lease(kv, clock, events, { nc, epochFloor: () => 1_000 });
    await l.start();
    expect(l.state().leader).toBe(false);
    // Before: the key stayed at 1001, held by nobody who leads (the fake never expires it).
    expect(kv.holder).toBeUndefined();
    await clock.advance(750); // the next campaign, a quarter lease later: above the floor now
    expect(l.state()).toMatchObject({ leader: true, epoch: 1_002 });
    await l.stop();
  });

  it("the first renewal goes a third of a lease after the create, however long the campaign's epoch floor took", async () => {
    const kv = new FakeKv();
    const clock = new ManualClock();
    const events: string[] = [];
    // The daemon's status probe at its bound (a quarter lease); the revision is above the floor, no purge.
    const l = lease(kv, clock, events, {
      epochFloor: async () => {
        await clock.advance(750);
        return 0;
      },
    });
    await l.start();
    expect(l.state()).toMatchObject({ leader: true, epoch: 101 });
    await clock.advance(250); // 1000 ms after the create was sent
    // Before: a third of a lease after the campaign ended (1750), leaving that renewal 1250 ms of the lease.
    expect(kv.updateTimeouts).toEqual([2000]);
    await clock.advance(6_000);
    expect(events).toEqual(["ready:101"]);
    expect(Math.min(...kv.updateTimeouts.map((t) => t ?? Infinity))).toBe(2000);
    await l.stop();
  });

  it("a follower never becomes leader while the key is held", async () => {
    const kv = new FakeKv();
    kv.holder = 50;
    const clock = new ManualClock();
    const l = lease(kv, clock, []);
    await l.start();
    await clock.advance(20_000);
    expect(l.state()).toMatchObject({ leader: false, epoch: null });
    await l.stop();
  });

  it("gives a renewal until the lease would expire and stops acting once a lease period passed without a successful renewal", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(3000);
    expect(l.epoch()).toBe(101);
    // renewals go out every third of the lease; each may take the rest of it (a slow one on a loaded machine keeps the lease)
    expect(kv.updateTimeouts.at(-1)).toBe(2000);
    // The last renewal that succeeded was sent at +3000; from then on no update answers.
    kv.hangUpdates = true;
    await clock.advance(2999);
    expect(l.epoch()).toBe(101);
    await clock.advance(2);
    expect(() => l.epoch()).toThrow(/has not renewed its lease/);
    expect(() => l.assert(101)).toThrow();
    expect(l.state()).toMatchObject({ leader: true, ready: false });
    expect(events).toEqual(["ready:101"]); // not demoted (the update is still pending), yet it refuses to act
    await l.stop(false);
  });

  it("a deposed leader whose wall clock steps backwards still stops acting a lease period after its last renewal", async () => {
    const { kv, clock, events, l } = await started();
    await clock.advance(3000);
    expect(l.epoch()).toBe(101);
    // The last renewal that succeeded was sent now; from then on no update answers (a successor may take the key).
    kv.hangUpdates = true;
    clock.stepWall(-6000);
    await clock.advance(2999);
    expect(l.epoch()).toBe(101);
    await clock.advance(2);
    expect(() => l.epoch()).toThrow(/has not renewed its lease/);
    expect(l.state()).toMatchObject({ leader: true, ready: false });
    expect(events).toEqual(["ready:101"]);
    await l.stop(false);
  });

  it("a forward wall-clock step does not shorten a new leader's one-lease-period wait; the key still carries wall time", async () => {
    const { kv, clock, events, l } = await started();
    clock.stepWall(6000);
    expect(() => l.epoch()).toThrow(/first lease period/);
    await clock.advance(2999);
    expect(() => l.epoch()).toThrow(/first lease period/);
    expect(l.state().ready).toBe(false);
    expect(events).toEqual([]);
    await clock.advance(1);
    expect(l.epoch()).toBe(101);
    expect(events).toEqual(["ready:101"]);
    // what the key says is for humans reading the bucket: the wall clock, step included
    expect(JSON.parse(kv.values.at(-1)!)).toEqual({ id: "me", term: expect.stringMatching(/^[0-9a-f]{16}$/), serving: false, epoch: 101, at: clock.now(), protocol_version: PROTOCOL_VERSION });
    await l.stop();
  });
});
