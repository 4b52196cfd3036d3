import { Bucket, type KV, type KvEntry, type KvWatchEntry } from "@nats-io/kv";
import { errors, type NatsConnection, type QueuedIterator, type Status } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { CheckpointError, equalJitter, MEMBER_HEARTBEAT_MS, MEMBER_TTL_MS, memberKey, type Member } from "../../protocol/index.js";
import { systemClock, type Clock } from "../engine/clock.js";
import type { ParticipantRef } from "../engine/participant-client.js";
import { KvMemberRegistry, operationOf, readEntry, type MembershipSource, type UnreadableMember } from "./member-registry.js";

type KvWatch = QueuedIterator<KvWatchEntry>;

/**
 * Reads of a re-created bucket tried before giving up: the watch still refreshes the view. The read
 * after a reconnect never gives up (see reseedAfterReconnect).
 */
const RESEED_ATTEMPTS = 6;

/** A key's latest entry: its member, or (never both) why it cannot be read. */
interface Cached {
  member?: Member;
  unreadable?: UnreadableMember;
  /**
   * When this entry was last written as this process saw it (its receipt, or the seed's read less
   * the entry's age by the server's timestamps), on the monotonic clock: a wall-clock step (NTP, a VM resume) must neither drop live members from
   * the next checkpoint nor keep a silent one in it.
   */
  seenAt: number;
  /**
   * The entry's revision: one the view holds already (the re-read after a reconnect aged it by the
   * server's timestamps) delivered by the watch late (its consumer, reset after the reconnect,
   * delivers what was written during the outage) is no fresher write and must not count as seen
   * now: a member that died during the outage would stay listed for another TTL.
   */
  revision: number;
}

/**
 * The membership registry kept in memory from a KV watch, so listing members costs nothing on the
 * checkpoint path. nats-server 2.9 sends no notification when max_age drops an entry, so an entry
 * not refreshed within MEMBER_TTL_MS is treated as gone, exactly as the bucket would drop it.
 */
export class WatchedMemberRegistry implements MembershipSource {
  private readonly cache = new Map<string, Cached>();
  private watch: KvWatch | undefined;
  /** The highest revision the watch delivered: a watch opened again resumes after it. */
  private lastRevision = 0;
  private stopped = false;
  /**
   * The keys the watch removed while a seed read the bucket: the seed may hold the entry it read
   * just before that removal, which would list a member that left for another TTL.
   */
  private removedWhileSeeding: Set<string> | undefined;
  /**
   * The bucket's stream as last checked (its creation time): a stream deleted and created again
   * under this registry restarts its sequence below `lastRevision`, where the watch's ordered
   * consumer resumes, so the watch delivers nothing until the new stream passes it.
   */
  private streamCreated: string | undefined;
  private streamCheck: NodeJS.Timeout | undefined;
  private checking = false;
  /** Bumped when the bucket is found re-created: a watch opened from the old stream's revision is dropped. */
  private generation = 0;
  /** Keys cached from a bucket since re-created: anything read from the new bucket replaces them. */
  private readonly fromOldBucket = new Set<string>();
  /**
   * The bucket read again after this process's connection came back, while in flight: listings
   * wait for it. Cut off longer than the TTL, the cache aged every member out, and the watch shows
   * them again only once its consumer notices the gap and resets (up to a heartbeat later): a
   * checkpoint started then would go ahead without live participants.
   */
  private reseeding: Promise<void> | undefined;
  /** Bumped per reconnect: an earlier reconnect's retries stop, the later one reads again. */
  private reseedRound = 0;
  /**
   * When (monotonic) this process's connection was lost, until a read after it succeeds: listings
   * wait for the read in flight meanwhile (viewMayMissMembers).
   */
  private lostAt: number | undefined;
  /** Disconnects seen: a read that succeeds after a later one does not make the view current (lostAt). */
  private disconnects = 0;
  /** The pauses between retries in flight: stop() ends them. */
  private readonly pauses = new Set<() => void>();
  /** Per read in flight (reconnects may follow each other), the keys the watch delivered meanwhile: what it delivered is newer. */
  private readonly touchedWhileReseeding = new Set<Set<string>>();
  private connectionStatus: AsyncIterable<Status> | undefined;
  /**
   * The refusal the bucket's config earned when checked again (see `assertBucket`): listings refuse
   * with it, as the coordinator's start would have, until a later check passes (each listing
   * checks again while it stands: refusedStill).
   */
  private refusal: CheckpointError | undefined;
  /** The assertion in flight: listings while refused share it rather than each sending its own. */
  private bucketCheck: Promise<void> | undefined;
  /** onIncarnationChange's listeners, per member key. */
  private readonly incarnationListeners = new Map<string, Set<() => void>>();

  constructor(
    private readonly kv: KV,
    private readonly logger?: Logger,
    private readonly clock: Clock = systemClock,
    private readonly ttlMs = MEMBER_TTL_MS,
    /** How often the bucket's stream is checked for a re-creation (real time). */
    private readonly streamCheckMs = MEMBER_HEARTBEAT_MS,
    /**
     * Asserts the bucket's config as the coordinator's start does (correcting what an update can,
     * refusing with a CheckpointError what it cannot), before each read of the bucket after a
     * reconnect or a re-creation: one re-created by hand (another TTL or history, memory storage)
     * was otherwise never checked again. Unset (a test's stand-in), nothing is checked.
     */
    private readonly assertBucket?: () => Promise<unknown>,
  ) {}

  async start(): Promise<void> {
    this.stopped = false;
    this.follow(await this.kv.watch({ include: "updates" }));
    // Seed after the watch is running so nothing written meanwhile is missed.
    await this.seed();
    this.streamCreated = (await this.streamInfo().catch(() => undefined))?.created;
    this.streamCheck = setInterval(() => void this.checkStream(), this.streamCheckMs);
    this.streamCheck.unref();
    this.followConnection();
  }

  /** Reads the bucket again whenever the connection comes back (see `reseeding`). */
  private followConnection(): void {
    // Kvm opens every bucket as a Bucket, whose manager knows its connection; a test's stand-in has none.
    const nc = this.kv instanceof Bucket ? (this.kv.jsm as Partial<{ getConnection(): NatsConnection }>).getConnection?.() : undefined;
    if (!nc) return;
    const status = nc.status();
    this.connectionStatus = status;
    void (async () => {
      for await (const s of status) {
        if (s.type === "disconnect") {
          this.lostAt ??= this.clock.monotonic();
          this.disconnects += 1;
        }
        if (s.type === "reconnect" && !this.stopped) void this.reseedAfterReconnect();
      }
    })().catch((error: unknown) => this.logger?.warn({ err: error }, "membership_status_watch_failed"));
  }

  /**
   * Reads the bucket again, retried (a JetStream that answers nothing yet right after the
   * reconnect, a stream leader being elected) until it succeeds, a later reconnect reads again, or
   * this registry stops. Listings wait for the read in flight, not for the pauses between. Never
   * given up: only a read makes the view current again (lostAt), and until then the restore
   * clean-up gives nobody up (viewCurrent), however long that takes.
   */
  private async reseedAfterReconnect(): Promise<void> {
    const round = ++this.reseedRound;
    const disconnects = this.disconnects;
    const ended = () => this.stopped || round !== this.reseedRound;
    const succeeded = await this.retrying("membership_reseed_failed", ended, Infinity, () => {
      const attempt = this.reseedOnce();
      // A listing waiting on it goes on with the view either way (the failure is logged by retrying).
      const reseeding = attempt.catch(() => undefined).finally(() => {
        if (this.reseeding === reseeding) this.reseeding = undefined;
      });
      this.reseeding = reseeding;
      return attempt;
    });
    // Lost again while it read (not reconnected yet): the view is not current, whatever this read saw.
    if (succeeded && round === this.reseedRound && disconnects === this.disconnects) this.lostAt = undefined;
  }

  /**
   * Runs `attempt` until it succeeds (true), `ended()` or `attempts` failures (false), with a
   * jittered pause growing per failure between (up to 5 s; real time, drawn from the clock's random
   * source: coordinators that lost NATS together spread out). Each failure is logged as `event`.
   */
  private async retrying(event: string, ended: () => boolean, attempts: number, attempt: () => Promise<void>): Promise<boolean> {
    for (let n = 1; !ended(); n++) {
      try {
        await attempt();
        return true;
      } catch (error) {
        this.logger?.warn({ err: error, attempt: n }, event);
        // Stopped while it was in flight: no pause (stop() ended those already) nor another try.
        if (n >= attempts || ended()) return false;
      }
      await this.pause(equalJitter(Math.min(5_000, 100 * 2 ** n), this.clock.random));
    }
    return false;
  }

  /** A real-time pause (a test clock's sleep returns at once) that stop() ends early. */
  private pause(ms: number): Promise<void> {
    // Taken after stop() (an attempt in flight failed since): nothing would end it.
    if (this.stopped) return Promise.resolve();
    return new Promise((resolve) => {
      const end = () => {
        clearTimeout(timer);
        this.pauses.delete(end);
        resolve();
      };
      const timer = setTimeout(end, ms);
      timer.unref();
      this.pauses.add(end);
    });
  }

  /** What the bucket holds now (a test's seam). */
  private readBucket(): ReturnType<KvMemberRegistry["read"]> {
    return new KvMemberRegistry(this.kv, this.logger).read(this.clock.now());
  }

  /**
   * `assertBucket`, its refusal kept for listings (logged once per reason) rather than thrown:
   * retrying the read cannot change the config; a bucket re-created again, or a listing while it
   * stands, checks again. Anything else (NATS not answering) is thrown, for the read to be retried.
   */
  private reassertBucket(): Promise<void> {
    const check = this.checkBucket().finally(() => {
      if (this.bucketCheck === check) this.bucketCheck = undefined;
    });
    this.bucketCheck = check;
    return check;
  }

  private async checkBucket(): Promise<void> {
    if (!this.assertBucket) return;
    try {
      await this.assertBucket();
      this.refusal = undefined;
    } catch (error) {
      if (!(error instanceof CheckpointError)) throw error;
      if (this.refusal?.message !== error.message) this.logger?.error({ err: error, code: error.code }, "membership_bucket_refused");
      this.refusal = error;
    }
  }

  private async reseedOnce(): Promise<void> {
    await this.reassertBucket();
    const touched = new Set<string>();
    this.touchedWhileReseeding.add(touched);
    try {
      const read = await this.readBucket();
      const now = this.clock.monotonic();
      const present = new Set<string>();
      const entries = [
        ...read.members.map(({ member, ageMs, revision }) => ({ key: memberKey(member.kind, member.instance), cached: { member }, ageMs, revision })),
        ...read.unreadable.map(({ unreadable, ageMs, revision }) => ({ key: unreadable.key, cached: { unreadable }, ageMs, revision })),
      ];
      for (const { key, cached, ageMs, revision } of entries) {
        present.add(key);
        const seenAt = now - Math.min(ageMs, this.ttlMs);
        const current = this.cache.get(key);
        // The same write the watch may have delivered late after the outage (taken as seen at its
        // delivery): as old as the server says. A newer one the watch delivered meanwhile stands.
        const older = !current || this.fromOldBucket.has(key) || current.revision < revision;
        if (current?.revision === revision && !this.fromOldBucket.has(key)) current.seenAt = Math.min(current.seenAt, seenAt);
        else if (!touched.has(key) && older) this.remember(key, { ...cached, seenAt, revision });
      }
      // Gone from the bucket meanwhile (deleted, expired): gone here too.
      for (const key of this.cache.keys()) if (!present.has(key) && !touched.has(key)) this.cache.delete(key);
    } finally {
      this.touchedWhileReseeding.delete(touched);
    }
  }

  private async streamInfo(): Promise<{ created: string; lastSeq: number } | undefined> {
    // Kvm opens every bucket as a Bucket; anything else (a test's stand-in) is not checked.
    if (!(this.kv instanceof Bucket)) return undefined;
    const info = await this.kv.jsm.streams.info(this.kv.stream);
    return { created: info.created, lastSeq: info.state.last_seq };
  }

  /**
   * A bucket deleted and created again (NATS back without its store, `nats kv rm`) while the watch
   * runs: nats.js re-creates the watch's consumer after the last sequence it delivered, past
   * everything the new stream holds, and stays silent, so every member would age out and stay out
   * however often it announces again. Found so, the watch is ended and opened afresh (updates from
   * now on, and the bucket's entries read again).
   */
  private async checkStream(): Promise<void> {
    if (this.stopped || this.checking) return;
    this.checking = true;
    // As of before the read: the watch may deliver a newer revision while it is in flight (every
    // heartbeat writes one), and a last sequence read before that is not a stream that went back.
    const seen = this.lastRevision;
    try {
      const info = await this.streamInfo();
      if (!info || this.stopped) return;
      const recreated = (this.streamCreated !== undefined && info.created !== this.streamCreated) || info.lastSeq < seen;
      this.streamCreated = info.created;
      if (!recreated) return;
      this.logger?.warn({ last_revision: seen, stream_last_seq: info.lastSeq }, "membership_bucket_recreated");
      this.generation += 1;
      this.lastRevision = 0;
      for (const key of this.cache.keys()) this.fromOldBucket.add(key);
      // Its loop ends, and rewatch() opens a watch of updates and seeds (no revision to resume from).
      this.watch?.stop();
    } catch (error) {
      // The stream may be gone for now (deleted, not yet created again): checked again later.
      this.logger?.debug({ err: error }, "membership_bucket_check_failed");
    } finally {
      this.checking = false;
    }
  }

  private async seed(): Promise<void> {
    const removed = (this.removedWhileSeeding = new Set());
    try {
      const seeded = await this.readBucket();
      const now = this.clock.monotonic();
      const entries = [
        ...seeded.members.map(({ member, ageMs, revision }) => ({ key: memberKey(member.kind, member.instance), cached: { member, revision }, ageMs })),
        ...seeded.unreadable.map(({ unreadable, ageMs, revision }) => ({ key: unreadable.key, cached: { unreadable, revision }, ageMs })),
      ];
      for (const { key, cached, ageMs } of entries) {
        // Seen when it was written, not now: a member that died just before this start would
        // otherwise count as alive for another TTL (checkpoints waiting on it).
        const replace = !this.cache.has(key) || this.fromOldBucket.has(key);
        if (replace && !removed.has(key)) this.remember(key, { ...cached, seenAt: now - Math.min(ageMs, this.ttlMs) });
      }
      // Kept until they age out, but at no revision: the new bucket restarted its revisions, and
      // any entry written there replaces them (Cached.revision).
      for (const key of this.fromOldBucket) {
        const kept = this.cache.get(key);
        if (kept) kept.revision = 0;
      }
      this.fromOldBucket.clear();
    } finally {
      if (this.removedWhileSeeding === removed) this.removedWhileSeeding = undefined;
    }
  }

  /**
   * Applies what `watch` delivers until it ends. nats.js ends a watch on its own (its ordered
   * consumer gives up after 30 failed re-creations, say while JetStream is unavailable, or its
   * subscription closes), quietly: the cache would then age every member out and never learn of
   * one again. A watch that ends while this registry runs is logged and opened again, from the
   * revision after the last one applied (what was written meanwhile is delivered, removals too).
   */
  private follow(watch: KvWatch): void {
    this.watch = watch;
    void (async () => {
      let failure: unknown;
      try {
        for await (const entry of watch) {
          if (this.watch !== watch) break;
          this.apply(entry, this.clock.monotonic());
        }
      } catch (error) {
        failure = error;
      }
      if (this.stopped || this.watch !== watch) return;
      this.logger?.warn({ err: failure, last_revision: this.lastRevision }, "membership_watch_ended");
      await this.rewatch();
    })().catch((error: unknown) => this.logger?.error({ err: error }, "membership_watch_failed"));
  }

  private async rewatch(): Promise<void> {
    for (let attempt = 1; !this.stopped; attempt++) {
      let watch: KvWatch;
      const generation = this.generation;
      try {
        watch = await this.kv.watch(this.lastRevision > 0 ? { resumeFromRevision: this.lastRevision + 1 } : { include: "updates" });
      } catch (error) {
        // The connection closed for good: its owner stops (the daemon exits); nothing to follow.
        if (error instanceof errors.ClosedConnectionError) return;
        this.logger?.warn({ err: error, attempt }, "membership_watch_reopen_failed");
        // Jittered (drawn from the clock's random source): coordinators that lost their watch in one NATS restart spread out.
        await this.pause(equalJitter(Math.min(5_000, 100 * 2 ** attempt), this.clock.random));
        continue;
      }
      if (this.stopped) return void watch.stop();
      // The bucket was found re-created while this watch opened from the old stream's revision.
      if (generation !== this.generation) {
        watch.stop();
        continue;
      }
      this.follow(watch);
      // Nothing applied yet: no revision to resume from, so what the bucket holds is read afresh
      // (retried: until then only members that beat again are listed). A later re-creation reads itself.
      if (this.lastRevision === 0) await this.retrying("membership_seed_failed", () => this.stopped || generation !== this.generation, RESEED_ATTEMPTS, async () => {
          await this.reassertBucket();
          await this.seed();
        });
      return;
    }
  }

  private apply(entry: KvEntry, now: number): void {
    this.lastRevision = Math.max(this.lastRevision, entry.revision);
    const operation = operationOf(entry, this.logger);
    if (operation === undefined) return; // unreadable: what the key held before stands
    const fromOldBucket = this.fromOldBucket.delete(entry.key);
    for (const touched of this.touchedWhileReseeding) touched.add(entry.key);
    if (operation !== "PUT") {
      this.cache.delete(entry.key);
      this.removedWhileSeeding?.add(entry.key);
      return;
    }
    const current = this.cache.get(entry.key);
    // Held already (see Cached.revision): not news. A bucket re-created restarts its revisions:
    // an entry cached from the old one is replaced whatever its revision (fromOldBucket, cleared above).
    if (current && !fromOldBucket && entry.revision <= current.revision) return;
    // An unreadable entry replaces what the key held: it is the key's latest, as a seed would read it.
    const read = readEntry(entry, this.logger);
    if (read) this.remember(entry.key, { ...read, seenAt: now, revision: entry.revision });
  }

  /** Caches `cached` under `key`, telling the key's listeners when it names another process. */
  private remember(key: string, cached: Cached): void {
    const before = this.cache.get(key)?.member?.incarnation;
    this.cache.set(key, cached);
    // An unreadable entry names no process: a request in flight to the one before keeps waiting.
    if (!cached.member || before === cached.member.incarnation) return;
    for (const listener of this.incarnationListeners.get(key) ?? []) {
      try {
        listener();
      } catch (error) {
        this.logger?.error({ err: error, member: key }, "membership_listener_failed");
      }
    }
  }

  onIncarnationChange(member: ParticipantRef, listener: () => void): () => void {
    const key = memberKey(member.kind, member.instance);
    const listeners = this.incarnationListeners.get(key) ?? new Set();
    this.incarnationListeners.set(key, listeners.add(listener));
    return () => {
      listeners.delete(listener);
      if (listeners.size === 0 && this.incarnationListeners.get(key) === listeners) this.incarnationListeners.delete(key);
    };
  }

  /** The live entries (refreshed within the TTL), in key order; expired ones are dropped. */
  private live(): Cached[] {
    const cutoff = this.clock.monotonic() - this.ttlMs;
    const live: [string, Cached][] = [];
    for (const [key, cached] of this.cache) {
      if (cached.seenAt < cutoff) this.cache.delete(key);
      else live.push([key, cached]);
    }
    return live.sort(([a], [b]) => (a < b ? -1 : 1)).map(([, cached]) => cached);
  }

  members(): Member[] {
    return this.live().flatMap((c) => (c.member ? [c.member] : []));
  }

  /**
   * Whether the view may be stale: the connection was lost and the bucket not read since. However
   * short the outage, what changed during it reaches the watch only once its consumer resets: a
   * member that joined is missing (a retire, the fence, would not reach it), one that left is still
   * listed (a prepare waits out its probes and fails), and one cut off longer than the TTL less a
   * heartbeat aged out. A listing waits for the read in flight (up to a JetStream request timeout,
   * 5 s), not for the pauses between reads.
   */
  private viewMayMissMembers(): boolean {
    return this.lostAt !== undefined;
  }

  /**
   * The refusal `assertBucket` keeps, checked again first: a bucket fixed in place (`nats stream
   * edit` dropping a stray subject or source) is neither re-created nor read again after a
   * reconnect, so the refusal would otherwise outlive the fault until the next one. Asserting fails
   * otherwise (NATS not answering): the refusal stands. A check in flight (another listing's, a
   * re-read's) is waited for rather than another sent: a burst of listings sends one.
   */
  private async refusedStill(): Promise<CheckpointError | undefined> {
    if (this.refusal) await (this.bucketCheck ?? this.reassertBucket()).catch(() => undefined);
    return this.refusal;
  }

  /**
   * Stays false for good once the connection closed for good: right, the view is never read again.
   * A restore clean-up does not wait on it there: its sends fail at once, the lease's next renewal
   * (a third of lease_ms) fails and demotes, the next send is refused not_leader and the op answers
   * outcome_unknown, which a successor completes; the daemon exits on nats_connection_closed.
   */
  viewCurrent(): boolean {
    return !this.viewMayMissMembers();
  }

  async list(): Promise<ParticipantRef[]> {
    if (this.viewMayMissMembers()) await this.reseeding;
    const refusal = await this.refusedStill();
    if (refusal) throw refusal;
    return this.members().map((m) => ({ kind: m.kind, instance: m.instance }));
  }

  /** The live entries this build cannot read: expired like members, replaced by a readable put, gone with a delete. */
  unreadableMembers(): UnreadableMember[] {
    return this.live().flatMap((c) => (c.unreadable ? [c.unreadable] : []));
  }

  async unreadable(): Promise<UnreadableMember[]> {
    if (this.viewMayMissMembers()) await this.reseeding;
    const refusal = await this.refusedStill();
    if (refusal) throw refusal;
    return this.unreadableMembers();
  }

  /**
   * Only a live entry's: one not refreshed within the TTL is gone, as `members()` treats it, even
   * while the server has not dropped it yet (a restart check would take its process for current).
   */
  incarnationOf(member: ParticipantRef): string | undefined {
    const cached = this.cache.get(memberKey(member.kind, member.instance));
    return cached && cached.seenAt >= this.clock.monotonic() - this.ttlMs ? cached.member?.incarnation : undefined;
  }

  stop(): void {
    this.stopped = true;
    if (this.streamCheck) clearInterval(this.streamCheck);
    this.streamCheck = undefined;
    this.watch?.stop();
    for (const end of [...this.pauses]) end();
    // nats.js's status iterator has stop(); its declared type is only AsyncIterable.
    (this.connectionStatus as { stop?: () => void } | undefined)?.stop?.();
    this.connectionStatus = undefined;
  }
}
