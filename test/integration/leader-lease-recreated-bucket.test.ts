import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Clock } from "../../coordinator/engine/clock.js";
import { LeaderLease } from "../../coordinator/ha/leader-lease.js";
import { decodeLeaseValue, encodeLeaseValue, LEADER_KEY, leaderBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

/** Timers fire only when the test says so (a frozen process): this lease's ticks are in the test's hands. */
class ManualClock implements Clock {
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private next = 0;
  private mono = 0;
  now(): number {
    return 1_000_000 + this.mono;
  }
  monotonic(): number {
    return this.mono;
  }
  setTimer(fn: () => void, ms: number): () => void {
    const id = this.next++;
    this.timers.push({ at: this.mono + ms, fn, id });
    return () => void (this.timers = this.timers.filter((t) => t.id !== id));
  }
  async sleep(): Promise<void> {}
  /** Time passes while the process is frozen: no timer fires until the next advance. */
  freezeFor(ms: number): void {
    this.mono += ms;
  }
  /**
   * Moves time on, firing due timers one at a time; each is the lease's tick, which ends by
   * scheduling the next one, so the next fires only after its requests reached the server.
   */
  async advance(ms: number): Promise<void> {
    const target = this.mono + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.at <= target).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.timers = this.timers.filter((t) => t.id !== due.id);
      this.mono = Math.max(this.mono, due.at); // a timer due during a freeze fires late, at the time it is now
      const scheduled = this.next;
      due.fn();
      await waitUntil(() => this.next > scheduled, "the lease's tick to finish", 10_000);
    }
    this.mono = target;
  }
}

let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

// Renewals name the key's revision only, and a bucket deleted and created again reuses revisions,
// so a renewal from a leader frozen past its lease could land on a successor's key at the revision
// it names. A renewal due after the lease expired here is not sent: the leader steps down.
describe("leader lease across a recreated leader bucket (ABA on the revision)", () => {
  it("a leader frozen past its lease does not renew: it cannot take over the key another coordinator holds at the same revision in the recreated bucket", async () => {
    const d = "aba";
    const nc = await nats.connect();
    const kv = await new Kvm(nc).create(leaderBucket(d), { history: 1, ttl: 60_000 });
    const clock = new ManualClock();
    const lost: number[] = [];
    const a = new LeaderLease({ nc, deployment: d, id: "A", leaseMs: 3000, clock, kv, onLost: (e) => void lost.push(e) });
    await a.start();
    await clock.advance(3000); // three renewals: A leads, ready, at epoch 1
    expect(a.state()).toMatchObject({ leader: true, ready: true, epoch: 1 });
    const held = (await kv.get(LEADER_KEY))!.revision;
    expect(held).toBeGreaterThan(1);

    // A freezes (no tick). Meanwhile the bucket is deleted and created again, and coordinator B
    // leads in it: its create and renewals bring the key to A's last revision.
    await (await jetstreamManager(nc)).streams.delete(`KV_${leaderBucket(d)}`);
    const nc2 = await nats.connect();
    const kvB = await new Kvm(nc2).create(leaderBucket(d), { history: 1, ttl: 60_000 });
    const b = (epoch: number | null) => encodeLeaseValue({ id: "B", term: "b", serving: false, epoch, at: Date.now() });
    let rev = await kvB.create(LEADER_KEY, b(null));
    const bEpoch = rev;
    while (rev < held) rev = await kvB.update(LEADER_KEY, b(bEpoch), rev);
    expect(rev).toBe(held);

    // A wakes after a freeze longer than its lease (B's renewals took at least that long): its
    // renewal would name revision `held`, which the recreated bucket's key now has.
    clock.freezeFor(3000 + held * 1000);
    await clock.advance(0);
    const now = await kvB.get(LEADER_KEY);
    const holder = decodeLeaseValue(now!.string());
    // B holds the key: A must have lost (a refused renewal), and the key must still be B's.
    expect({ aLeader: a.state().leader, holder: holder?.id, lost }).toEqual({ aLeader: false, holder: "B", lost: [1] });
    await a.stop(false);
    await nc2.close();
    await nc.close();
  });
});
