import { randomBytes } from "node:crypto";
import { JetStreamApiCodes, jetstreamManager } from "@nats-io/jetstream";
import type { KV, KvEntry } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { CheckpointError, decodeLeaseValue, encodeLeaseValue, isPassableEpoch, isWrongRevision, LEADER_KEY, leaderBucket, leaderOfOtherVersion, MIN_LEASE_MS, within } from "../../protocol/index.js";
import { systemClock, type Clock } from "../engine/clock.js";
import { openBucketAsserted, readsFromStreamLeader } from "../membership/kv-bucket.js";
import { coordinatorTelemetry } from "../telemetry/coordinator-telemetry.js";
import type { Leadership, LeadershipState } from "./leadership.js";

export { LEADER_KEY };

export interface LeaderLeaseOptions {
  nc: NatsConnection;
  deployment: string;
  id: string;
  /** Lease period = the leader bucket's max_age. */
  leaseMs: number;
  clock?: Clock;
  logger?: Logger;
  /** Called once leadership became usable (after the first lease period), with the epoch. */
  onReady?: (epoch: number) => void | Promise<void>;
  /** Called when leadership is lost. */
  onLost?: (epoch: number) => void;
  /** An already opened leader bucket (tests); opened and asserted from `nc` otherwise. */
  kv?: KV;
  /**
   * The highest epoch already in use: the daemon's is the highest a published checkpoint carries
   * (its checkpoint root), a registered participant reports having seen or a decision journal entry
   * carries (read within a bound well inside the lease). A won revision not above it is moved past
   * it: see `campaign`.
   */
  epochFloor?: () => number | Promise<number>;
  /** Test-only fault injection. */
  hooks?: LeaderLeaseHooks;
}

/** Test-only fault injection and observation points of the lease's start-up; unset, each costs one optional call. */
export interface LeaderLeaseHooks {
  /** Test-only. Called with the leader bucket's handle before each check that nobody leads, at a shortening of the lease (a test has its reads answered as by a lagging replica). */
  beforeLeaderCheck?: (kv: KV) => void;
  /** Test-only. Awaited after each such check found nobody leading (a test has a coordinator win the lease in that gap). */
  afterNoLeaderFound?: () => Promise<void>;
}

/**
 * Leader election on a JetStream KV bucket whose max_age is the lease period (2.9-compatible: no
 * per-key TTL). Campaign = `create` (succeeds only when the key is absent); the revision it returns
 * is the epoch. The leader renews every third of the lease with `update` on the last revision; any
 * failure, or no answer before the lease would expire, demotes at once. A new leader waits one full lease period before it is ready, so a
 * deposed leader has time to notice, and participants fence lower epochs anyway. That wait and the local
 * expiry are measured on the monotonic clock: a wall-clock step must not stretch a deposed leader's
 * authority nor cut a new leader's wait.
 */
export class LeaderLease implements Leadership {
  private kv: KV | undefined;
  private heldEpoch: number | null = null;
  private lastRevision = 0;
  /** The value the write that made `lastRevision` carried. */
  private heldValue = "";
  /** When leadership becomes usable (monotonic clock, like renewedAt). */
  private readyAt = Infinity;
  private readyFired = false;
  /** When the last successful create/update was sent (monotonic clock): the key lives at most leaseMs past it. */
  private renewedAt = -Infinity;
  /**
   * Names the term in the key's value (drawn per campaign, kept by its renewals): a controller
   * waiting for a reply tells a new term of the same coordinator id (it lost the lease and won it
   * back, or restarted under a configured coordinator_id) from the term that took its request.
   */
  private term = "";
  /** Whether this term serves the controller API yet (written into the key: see `markServing`). */
  private serving = false;
  private timer: (() => void) | undefined;
  private stopped = false;
  private readonly clock: Clock;

  constructor(private readonly options: LeaderLeaseOptions) {
    // The config refuses it; an in-process caller hands its options straight here.
    if (!(options.leaseMs >= MIN_LEASE_MS)) throw new CheckpointError("invalid_request", `lease_ms ${options.leaseMs} is below ${MIN_LEASE_MS}: controller clients rely on a new term waiting at least that long before it serves`);
    this.clock = options.clock ?? systemClock;
  }

  async start(): Promise<void> {
    this.kv =
      this.options.kv ??
      (await openBucketAsserted(this.options.nc, leaderBucket(this.options.deployment), {
        history: 1,
        ttl: this.options.leaseMs,
        purges: "stream", // leadAbove moves the revisions past the epoch floor by a purge
        beforeShortening: (kv, foundTtl) => this.refuseShorteningUnderLeader(kv, foundTtl),
      }));
    await this.tick();
  }

  /**
   * A shorter lease_ms than the bucket's would expire the leader's key at once, while that leader
   * renews every third of its longer lease and acts on it until its next renewal fails: a successor
   * could win and serve meanwhile. So it is lowered only while nobody leads (raising is safe).
   */
  private async refuseShorteningUnderLeader(kv: KV, foundTtl: number): Promise<void> {
    this.options.hooks?.beforeLeaderCheck?.(kv);
    // From the stream's leader: a lagging replica's "nobody leads" would let it shorten under one.
    const held = await readsFromStreamLeader(kv).get(LEADER_KEY);
    if (held?.operation !== "PUT") return await this.options.hooks?.afterNoLeaderFound?.();
    throw new CheckpointError(
      "invalid_request",
      `the leader lease of deployment ${this.options.deployment} is ${foundTtl} ms and a coordinator leads with it (${held.string()}); this coordinator's lease_ms ${this.options.leaseMs} would cut it short under that leader. Stop every coordinator of the deployment to lower lease_ms, or start this one with lease_ms ${foundTtl} (raising it needs no stop)`,
    );
  }

  epoch(): number {
    if (this.heldEpoch === null) {
      const other = this.otherVersionLeader;
      throw new CheckpointError("not_leader", `coordinator ${this.options.id} does not hold the leader lease${other === undefined ? "" : `: ${other}`}`);
    }
    const now = this.clock.monotonic();
    if (now < this.readyAt) throw new CheckpointError("not_leader", `coordinator ${this.options.id} is waiting out its first lease period`);
    if (!this.renewedRecently(now)) throw new CheckpointError("not_leader", `coordinator ${this.options.id} has not renewed its lease for ${now - this.renewedAt} ms`);
    return this.heldEpoch;
  }

  assert(epoch: number): void {
    if (this.epoch() !== epoch) throw new CheckpointError("not_leader", `epoch ${epoch} is no longer this coordinator's`);
  }

  leaderOfOtherVersion(): string | undefined {
    return this.heldEpoch === null ? this.otherVersionLeader : undefined;
  }

  /**
   * Set when a campaign found the key held by a coordinator of another protocol version (read
   * after the create was refused): its controllers get `not_leader` naming it, not a bare one.
   */
  private otherVersionLeader: string | undefined;

  /** Reads who holds the key a campaign's create found held; logged once per such holder of another version. */
  private async noteHolder(): Promise<void> {
    // Bounded: the next tick must not wait on it.
    const entry = await within(this.kv!.get(LEADER_KEY), this.options.leaseMs / 4).catch(() => null);
    const other = entry?.operation === "PUT" ? leaderOfOtherVersion(decodeLeaseValue(entry.string())) : undefined;
    if (other !== undefined && other !== this.otherVersionLeader) this.options.logger?.error({ detail: other }, "lease_held_by_other_protocol_version");
    this.otherVersionLeader = other;
  }

  state(): LeadershipState {
    const leader = this.heldEpoch !== null;
    const now = this.clock.monotonic();
    return { id: this.options.id, leader, ready: leader && now >= this.readyAt && this.renewedRecently(now), epoch: this.heldEpoch, serving: leader && this.serving };
  }

  /** Local expiry: a successor may hold the key once a lease period passed without a renewal. */
  private renewedRecently(now: number): boolean {
    return now <= this.renewedAt + this.options.leaseMs;
  }

  /** The key was created at `revision` by a request sent at `sentAt`: this coordinator leads. */
  private won(revision: number, sentAt: number): void {
    // Holding the key, no earlier write of this coordinator's can land any more.
    this.leftBehind = [];
    this.renewedAt = sentAt;
    this.heldEpoch = revision;
    this.lastRevision = revision;
    this.readyAt = this.clock.monotonic() + this.options.leaseMs;
    this.readyFired = false;
    coordinatorTelemetry().leaderChanges.add(1, { event: "won" });
    this.options.logger?.info({ epoch: revision, ready_in_ms: this.options.leaseMs }, "lease_won");
  }

  /** Campaign at once instead of at the next tick (failover tests; operators forcing a hand-over). */
  async campaignNow(): Promise<boolean> {
    // Never race the timer loop: let a tick in flight finish first, then own the single timer.
    while (this.inflight) await this.inflight;
    if (this.heldEpoch !== null || this.stopped || !this.kv) return this.heldEpoch !== null;
    // The pending tick now, in its place: fired while a campaign of its own was in flight, it would
    // start a second timer chain, whose renewals race this one's on the same revision.
    this.timer?.();
    this.timer = undefined;
    await this.tick();
    return this.heldEpoch !== null;
  }

  /**
   * The daemon subscribed the controller API in term `epoch` (after its first lease period and its
   * recovery): written into the key at once. A controller whose request the lease shows reached no
   * serving coordinator (a successor not serving yet, while a frozen predecessor still subscribed
   * took it and stays silent) stops waiting for it instead of waiting for this term to end.
   */
  async markServing(epoch: number): Promise<void> {
    // As campaignNow: never race the timer loop; the renewal below takes the pending tick's place.
    while (this.inflight) await this.inflight;
    if (this.stopped || this.heldEpoch !== epoch) return;
    this.serving = true;
    this.timer?.();
    this.timer = undefined;
    await this.tick();
  }

  /**
   * Creates the key: its revision is the epoch. One not above the highest epoch already in use
   * (`epochFloor`) means the bucket's revisions started over (the bucket was recreated, or JetStream
   * lost its store): retention would rank this leader's checkpoints below the older ones, and
   * participants that saw those epochs would refuse it. The bucket's sequence is then moved past
   * that epoch (a purge up to it, which takes this fresh key too) and the key created again; a
   * coordinator that created it meanwhile wins instead. A campaign that fails after creating the key
   * (the floor or the purge failed) deletes it: left in place, held by nobody who leads, it would
   * refuse every coordinator's create (this one's too) until it expired a lease later.
   * Returns the epoch and when the create that made the key held now was sent (`sentAt`, or the
   * second create's: the lease runs from there, however long the floor and the purge took).
   */
  private async campaign(value: string, sentAt: number): Promise<{ epoch: number; sentAt: number }> {
    this.campaignStep = "create";
    const revision = await this.createKey(value);
    try {
      this.campaignStep = "status";
      await this.assertBucketLease();
      return await this.leadAbove(revision, value, sentAt);
    } catch (error) {
      // Only that key: after a purge it is gone, and a successor's differs, so the delete is refused.
      await this.kv!.delete(LEADER_KEY, { previousSeq: revision }).catch(() => undefined);
      throw error;
    }
  }

  /**
   * The bucket's max_age is the key's real lifetime. A coordinator started since with a shorter
   * lease_ms lowers it while nobody leads, also under this one following with a longer lease_ms:
   * leading, this one would act for its lease_ms after each renewal while its key expired sooner,
   * and a successor could be ready meanwhile. So it leads only under a lease at least its own.
   */
  private async assertBucketLease(): Promise<void> {
    // Unread (a JetStream hiccup): not a reason to stay leaderless; taken as start-up asserted it.
    const ttl = await this.kv!.status().then(
      (status) => status.ttl,
      (error: unknown) => void this.options.logger?.warn({ err: error }, "lease_bucket_status_unread"),
    );
    if (ttl === undefined || ttl === 0 || ttl >= this.options.leaseMs) return;
    throw new CheckpointError(
      "invalid_request",
      `the leader lease of deployment ${this.options.deployment} is ${ttl} ms (a coordinator with that lease_ms started since this one), shorter than this coordinator's lease_ms ${this.options.leaseMs}: it does not lead under it; restart it with lease_ms ${ttl}`,
    );
  }

  /**
   * Creates the key with `value`. A create left unanswered (a timeout, the connection dropped) may
   * have landed all the same: that key would refuse every create, this coordinator's next included,
   * until it expired a lease later, so it is read back and, found, deleted.
   */
  private async createKey(value: string): Promise<number> {
    try {
      return await this.kv!.create(LEADER_KEY, value);
    } catch (error) {
      if (!isWrongRevision(error)) {
        const landed = await this.revisionHolding(value, this.options.leaseMs / 4);
        if (landed !== undefined) await this.kv!.delete(LEADER_KEY, { previousSeq: landed }).catch(() => undefined);
        // Added, not in place of the others: a failed renewal's values may still be the key's (or land late).
        else this.leftBehind.push(value);
      } else await this.releaseLeftBehind();
      throw error;
    }
  }

  /** The key created at `revision` (sent at `sentAt`), or the one created past the epoch floor: see `campaign`. */
  private async leadAbove(revision: number, value: string, sentAt: number): Promise<{ epoch: number; sentAt: number }> {
    this.campaignStep = "epoch_floor";
    const floor = (await this.options.epochFloor?.()) ?? 0;
    if (revision > floor) return { epoch: revision, sentAt };
    // One no sequence can pass (a hand-edited checkpoint.json's epoch past 2^53) must not keep every coordinator from leading.
    if (!isPassableEpoch(floor)) {
      this.options.logger?.error({ revision, epoch_floor: floor }, "epoch_floor_out_of_range_ignored");
      return { epoch: revision, sentAt };
    }
    this.options.logger?.warn({ revision, epoch_floor: floor }, "lease_revisions_behind_epochs_in_use");
    this.campaignStep = "purge";
    const jsm = await jetstreamManager(this.options.nc);
    await jsm.streams.purge(`KV_${leaderBucket(this.options.deployment)}`, { seq: floor + 1 });
    const recreatedAt = this.clock.monotonic();
    this.campaignStep = "create";
    return { epoch: await this.createKey(value), sentAt: recreatedAt };
  }

  /**
   * The key's value: who leads, in which term (see `term`), its epoch once won (null in the create:
   * a restarted participant fences below the revision then; see leaseEpochFloor), and when it last wrote,
   * in wall time (for humans; never compared).
   */
  private keyValue(): string {
    return encodeLeaseValue({ id: this.options.id, term: this.term, serving: this.serving, epoch: this.heldEpoch, at: this.clock.now() });
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = this.clock.setTimer(() => {
      this.tick().catch((error: unknown) => this.options.logger?.error({ err: error }, "lease_tick_failed"));
    }, ms);
  }

  private inflight: Promise<void> | undefined;

  private tick(): Promise<void> {
    const run = this.tickOnce().finally(() => {
      if (this.inflight === run) this.inflight = undefined;
    });
    this.inflight = run;
    return run;
  }

  private async tickOnce(): Promise<void> {
    if (this.stopped) return;
    const sentAt = this.clock.monotonic();
    if (this.heldEpoch === null) {
      // A campaign: a new term, which serves nothing yet.
      this.term = randomBytes(8).toString("hex");
      this.serving = false;
    }
    const value = this.keyValue();
    if (this.heldEpoch === null) {
      try {
        const won = await this.campaign(value, sentAt);
        this.won(won.epoch, won.sentAt);
        this.heldValue = value;
        this.campaignFailure = undefined;
        this.otherVersionLeader = undefined;
      } catch (error) {
        // Someone else leads, or the server is unreachable or refuses: campaign again later.
        this.campaignFailed(error, this.kvOpFields(this.campaignStep, sentAt));
        // Not awaited: the campaign's timing stays the create's alone.
        if (isWrongRevision(error)) void this.noteHolder();
      }
    } else if (!this.renewedRecently(sentAt)) {
      // Expired here already (this process was frozen, or starved, past a lease): a successor may
      // hold the key, and in a bucket deleted and created again meanwhile its key can have reached
      // the very revision this renewal names, which the update would then take over. Not renewed:
      // demoted, and the key released at the next campaign if it still holds our last value.
      this.leftBehind = [this.heldValue];
      this.demote(new CheckpointError("not_leader", `coordinator ${this.options.id}'s lease expired locally before its renewal was sent (${sentAt - this.renewedAt} ms since the last)`));
    } else {
      let timeoutMs: number | undefined;
      try {
        // Until the lease would expire locally, not JetStream's 5 s default: a renewal that cannot
        // finish in time demotes, while a merely slow one (a loaded machine) keeps the lease.
        // Acting is fenced by renewedRecently meanwhile, so waiting longer never extends authority.
        timeoutMs = Math.max(1, Math.floor(this.renewedAt + this.options.leaseMs - sentAt));
        this.lastRevision = await this.kv!.update(LEADER_KEY, value, this.lastRevision, timeoutMs);
        this.heldValue = value;
        this.renewedAt = sentAt;
      } catch (error) {
        if (!(await this.renewalLanded(value, sentAt, error))) {
          // Not refused: the key may still hold its last renewal (a 503 from a JetStream electing its
          // stream leader fails at once, a lease before the key expires), or this one, landing late.
          if (!isWrongRevision(error)) this.leftBehind = [value, this.heldValue];
          this.demote(error, { ...this.kvOpFields("update", sentAt), timeout_ms: timeoutMs });
        }
      }
    }
    // Stopped while that request was in flight: it only records the revision stop's release names;
    // a stopped lease never announces leadership (the daemon's onReady would start a recovery).
    if (this.stopped) return;
    if (this.heldEpoch !== null && !this.readyFired) {
      const wait = this.readyAt - this.clock.monotonic();
      if (wait <= 0) {
        this.readyFired = true;
        const epoch = this.heldEpoch;
        this.options.logger?.info({ epoch }, "lease_ready");
        void Promise.resolve(this.options.onReady?.(epoch)).catch((error: unknown) => this.options.logger?.error({ err: error }, "on_ready_failed"));
      } else {
        this.schedule(Math.min(wait, this.untilRenewal()));
        return;
      }
    }
    this.schedule(this.heldEpoch === null ? this.options.leaseMs / 4 : this.untilRenewal());
  }

  /**
   * A third of a lease after the last create or renewal was sent, not after it was answered: a
   * campaign that waited for its epoch floor (up to a quarter lease) or a slow renewal must not
   * push the next renewal toward the key's expiry.
   */
  private untilRenewal(): number {
    return Math.max(0, this.renewedAt + this.options.leaseMs / 3 - this.clock.monotonic());
  }

  /**
   * Whether a renewal that failed without a refusal (it timed out, the connection dropped) landed
   * all the same: the key then holds its value at a later revision. Demoted, this coordinator would
   * leave that key held by nobody who leads, refusing every create (its own too) until it expired a
   * lease later. Read back within what that renewal's lease leaves (from the stream's leader: a
   * lagging replica would show the key as it was); found, it counts as the renewal, sent at `sentAt`.
   */
  private async renewalLanded(value: string, sentAt: number, error: unknown): Promise<boolean> {
    const left = sentAt + this.options.leaseMs - this.clock.monotonic();
    if (isWrongRevision(error) || left <= 0) return false;
    const revision = await this.revisionHolding(value, left);
    // A later revision than the one it named (an earlier renewal in the same millisecond wrote the same value).
    if (revision === undefined || revision <= this.lastRevision) return false;
    this.options.logger?.warn({ epoch: this.heldEpoch, revision, err: error }, "lease_renewal_landed_unanswered");
    this.lastRevision = revision;
    this.heldValue = value;
    this.renewedAt = sentAt;
    return true;
  }

  /**
   * The key's revision if it holds exactly `value` (keys name their term and time, so no other
   * write is equal), read within `withinMs` from the stream's leader (a lagging replica would show
   * the key as it was); undefined otherwise, or unread.
   */
  private async revisionHolding(value: string, withinMs: number): Promise<number | undefined> {
    const now = await this.readKey(withinMs);
    return now?.operation === "PUT" && now.string() === value ? now.revision : undefined;
  }

  /** The key as the stream's leader has it (null: none), or undefined when unread within `withinMs`. */
  private async readKey(withinMs: number): Promise<KvEntry | null | undefined> {
    let cancel: (() => void) | undefined;
    const timedOut = new Promise<undefined>((resolve) => (cancel = this.clock.setTimer(() => resolve(undefined), withinMs)));
    const now = await Promise.race([readsFromStreamLeader(this.kv!).get(LEADER_KEY), timedOut]).catch(() => undefined);
    cancel?.();
    return now;
  }

  /**
   * Values of this coordinator's writes the key may hold while it does not lead: one that went
   * unanswered and was not found landed when read back (the server may still apply it, a late
   * request), and, after a renewal failed so, the last one that landed (the key lives a lease past
   * it). Held by nobody who leads, such a key refuses every create until it expires.
   */
  private leftBehind: string[] = [];

  /**
   * Deletes the key if it holds one of `leftBehind` (a campaign refused because the key is held, or
   * a stop), so the next campaign, this coordinator's or another's, need not wait for its expiry.
   * Forgotten once the key holds another coordinator's write: these can no longer land.
   */
  private async releaseLeftBehind(): Promise<void> {
    if (this.leftBehind.length === 0) return;
    const now = await this.readKey(this.options.leaseMs / 4);
    if (now?.operation !== "PUT") return;
    if (this.leftBehind.includes(now.string())) {
      this.options.logger?.warn({ revision: now.revision }, "lease_key_left_behind_released");
      await this.kv!.delete(LEADER_KEY, { previousSeq: now.revision }).catch(() => undefined);
    }
    this.leftBehind = [];
  }

  /** The last campaign failure logged (its message), until a campaign wins or finds the key held. */
  private campaignFailure: string | undefined;

  /**
   * Another coordinator holding the key is the normal case; anything else (no permission to
   * create the key or to purge past a published epoch, a timeout) would keep every coordinator
   * from leading without a word: logged once per cause, not once per tick.
   */
  private campaignFailed(error: unknown, fields: object): void {
    const code = (error as { code?: unknown }).code;
    const message = error instanceof Error ? error.message : String(error);
    if (code === JetStreamApiCodes.StreamWrongLastSequence || code === JetStreamApiCodes.StreamWrongLastSequenceUnknown || message.startsWith("wrong last sequence")) {
      this.campaignFailure = undefined;
      return;
    }
    if (message === this.campaignFailure) return;
    this.campaignFailure = message;
    this.options.logger?.warn({ ...fields, err: error }, "lease_campaign_failed");
  }

  /**
   * The campaign's step under way (the KV op, or the epoch floor's status probe): a failure's
   * `err` is often only "timeout", which says nothing of what timed out.
   */
  private campaignStep = "create";

  /** What a lease line names of the KV op that failed: which op, on which bucket and key, and how long it waited. */
  private kvOpFields(op: string, sentAt: number): { kv_op: string; bucket: string; key: string; waited_ms: number } {
    return { kv_op: op, bucket: leaderBucket(this.options.deployment), key: LEADER_KEY, waited_ms: Math.round(this.clock.monotonic() - sentAt) };
  }

  private demote(cause: unknown, fields: object = {}): void {
    const epoch = this.heldEpoch;
    if (epoch === null) return;
    this.heldEpoch = null;
    this.readyAt = Infinity;
    coordinatorTelemetry().leaderChanges.add(1, { event: "lost" });
    this.options.logger?.warn({ epoch, ...fields, err: cause }, "lease_lost");
    this.options.onLost?.(epoch);
  }

  /** Stops renewing; a leader deletes its key so a successor need not wait for expiry. */
  async stop(release = true): Promise<void> {
    this.stopped = true;
    this.timer?.();
    // A renewal (or campaign) in flight lands a revision the delete below must name: else the
    // delete is refused and the key lives on until its expiry, and the successor waits for it.
    // (Each such request ends within its timeout, at most the rest of the lease.)
    while (release && this.inflight) await this.inflight;
    if (release && this.heldEpoch !== null && this.kv) {
      const epoch = this.heldEpoch;
      this.heldEpoch = null;
      await this.kv.delete(LEADER_KEY, { previousSeq: this.lastRevision }).catch(() => undefined);
      this.options.onLost?.(epoch);
    } else if (release && this.kv) await this.releaseLeftBehind();
  }
}
