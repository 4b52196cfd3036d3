import { errors, type NatsConnection, type Status } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from "@nats-io/jetstream";
import { Kvm, type KV } from "@nats-io/kv";
import type { Logger } from "pino";
import {
  awaitBucketStore,
  CheckpointError,
  DeploymentSchema,
  FailureSpellLog,
  ErrorReplySchema,
  InstanceSchema,
  isNoResponders,
  isWrongRevision,
  MEMBER_HEARTBEAT_MS,
  MEMBER_TTL_MS,
  kvReplicas,
  MemberSchema,
  PROTOCOL_VERSION,
  memberKey,
  membersBucket,
  parseName,
  participantSubject,
  StatusReplySchema,
  within,
  type Kind,
  type Member,
} from "../../protocol/index.js";

/** How long the claim's probe waits for another process to answer on this participant's subjects. */
const PROBE_TIMEOUT_MS = 2_000;

/**
 * The least a beat's JetStream requests wait for an answer (they wait a heartbeat period when that
 * is longer). A beat is given up after a period anyway; with nats.js' default (5 s) its requests
 * outlived it, and with a short period an outage kept up to 5 s / period of them in flight. Not
 * shorter: a loaded JetStream's answer within a second still lands the put.
 */
export const BEAT_REQUEST_MIN_TIMEOUT_MS = 1_000;

/**
 * How long `stop()` tries to delete the entry, and how long each of its requests waits (none
 * outlives it). With NATS down its request waited out the JetStream timeout (5 s), the whole of
 * the Gym launcher's grace before SIGKILL; the entry then expires with the bucket's TTL, as it
 * would have anyway.
 */
export const STOP_DELETE_WAIT_MS = 1_000;

/** Test-only fault injection points of the announcer; unset, each costs one optional call. */
export interface MembershipAnnouncerHooks {
  /** Test-only. Called with each members bucket handle the announcer opens, before it is used (a test has its reads answered as by a lagging replica). */
  onBucketOpened?: (kv: KV) => void;
}

/**
 * Announces this participant in the deployment's membership registry and keeps the entry fresh.
 * The bucket's max_age (not per-key TTL, which nats-server 2.9 ignores) drops silent members.
 *
 * One process per kind/instance: two would share the subjects (each answering some requests) and
 * overwrite each other's entry, so every checkpoint would fail with a misleading stale_incarnation.
 * `claim()` (before the endpoint subscribes) refuses with `instance_conflict` when another
 * participant answers on this participant's subjects (a silent subscriber, such as a monitoring
 * tap, is no participant); `start()` then writes the entry by revision compare-and-set, so of two
 * processes starting at once only one wins. An entry left by a predecessor that is gone
 * (SIGKILLed: nobody answers, though its heartbeat is younger than the TTL) is taken over.
 *
 * The other side of a takeover: a process cut off from NATS long enough to be replaced finds,
 * when its heartbeat's compare-and-set is refused, another incarnation in its entry. Only that
 * definite observation (the entry as the stream leader holds it, never a replica's possibly
 * lagging copy) settles `lost`; its owner must stop serving the name at once. Failed or timed-out
 * writes, an expired or deleted entry, a re-created bucket are transient: the entry is written
 * again. A reconnect beats at once, so the check does not wait a heartbeat period.
 *
 * Beats keep their cadence under a slow NATS: a beat is given up one heartbeat period after it
 * started, and a tick while one runs starts the next as soon as it ends, so one slow put costs
 * one beat, never the entry's TTL. A beat's requests wait max(period, 1 s), not nats.js' 5 s: in an
 * outage the given-up ones do not pile up (start-up's keep the default).
 */
export class MembershipAnnouncer {
  private kv: KV | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly member: Member;
  /** Revision of our entry as last written (or of the entry seen at claim: 0 when there was none). */
  private revision: number | undefined;
  /** The gone predecessor `claim()` found in the entry (its incarnation), if any. */
  private predecessor: string | undefined;
  private isLost = false;
  private stopped = false;
  /** Bumped per beat started and when it ends: a beat given up or overtaken (a reconnect) records nothing more. */
  private beatSerial = 0;
  private beatInFlight = false;
  /** A tick came while a beat ran: the next beat starts when that one ends. */
  private beatDue = false;
  private statusWatch: AsyncIterable<Status> | undefined;
  /** Start-up's (nats.js' default timeout), and the beats' (`beatTimeoutMs`). */
  private jsm: JetStreamManager | undefined;
  private beatJsm: JetStreamManager | undefined;
  /** How long each JetStream request of a beat waits: max(heartbeat period, BEAT_REQUEST_MIN_TIMEOUT_MS). */
  private readonly beatTimeoutMs: number;
  private resolveLost!: (conflict: CheckpointError) => void;
  /**
   * Settles with an `instance_conflict` error once another incarnation is found holding this
   * participant's entry (it stopped announcing then); pending forever otherwise.
   */
  readonly lost = new Promise<CheckpointError>((resolve) => (this.resolveLost = resolve));
  /** A spell of failing beats (NATS unreachable): one warning, not one per beat. */
  private readonly beatFailures: FailureSpellLog;

  constructor(
    private readonly nc: NatsConnection,
    private readonly deployment: string,
    kind: Kind,
    instance: string,
    /** The control plane's own incarnation: the coordinator addresses guarded messages to it. */
    incarnation: string,
    private readonly logger?: Logger,
    private readonly heartbeatMs = MEMBER_HEARTBEAT_MS,
    /** Test-only fault injection. */
    private readonly hooks?: MembershipAnnouncerHooks,
  ) {
    // Its bucket's name, its key and the subject it probes.
    parseName(DeploymentSchema, deployment, "a participant's deployment");
    parseName(InstanceSchema, instance, "a participant's instance");
    // The bucket drops an entry MEMBER_TTL_MS after its last write: a period at or past a third of
    // that lets it expire between beats (one slow or failed beat is enough), and the coordinator
    // leaves the participant out of checkpoints; 0 or NaN would beat every millisecond.
    if (!(Number.isFinite(heartbeatMs) && heartbeatMs > 0 && heartbeatMs <= MEMBER_TTL_MS / 3)) {
      throw new CheckpointError("invalid_request", `heartbeatMs ${heartbeatMs} must be a number of milliseconds > 0 and at most a third of the membership TTL (${MEMBER_TTL_MS / 3})`);
    }
    this.beatTimeoutMs = Math.max(heartbeatMs, BEAT_REQUEST_MIN_TIMEOUT_MS);
    this.beatFailures = new FailureSpellLog(logger, "membership heartbeat lands again");
    const now = Date.now() / 1000;
    this.member = { kind, instance, incarnation, started_at: now, heartbeat_at: now, protocol_version: PROTOCOL_VERSION };
  }

  get key(): string {
    return memberKey(this.member.kind, this.member.instance);
  }

  private get name(): string {
    return `${this.member.kind}/${this.member.instance}`;
  }

  /**
   * Call before subscribing the control subjects: reads the entry (its revision is what `start()`
   * replaces) and refuses when another process answers on this participant's status subject.
   */
  async claim(): Promise<void> {
    const { revision, held } = await this.readEntry();
    this.revision = revision;
    this.predecessor = held?.incarnation;
    const other = held ? ` (membership entry: incarnation ${held.incarnation}, heartbeat ${new Date(held.heartbeat_at * 1000).toISOString()})` : "";
    if (await this.someoneAnswers()) {
      throw new CheckpointError("instance_conflict", `another process already serves ${this.name} in deployment ${this.deployment}${other}; run one process per kind/instance`);
    }
    if (held) this.logger?.info({ previous_incarnation: held.incarnation }, "membership entry of a gone predecessor taken over");
  }

  async start(): Promise<void> {
    if (this.revision === undefined) await this.claim();
    const conflict = () => new CheckpointError("instance_conflict", `another process claimed ${this.name} in deployment ${this.deployment} while this one started; run one process per kind/instance`);
    try {
      await this.write();
    } catch (error) {
      if (!isWrongRevision(error)) throw error;
      // The entry changed since claim(). The gone predecessor's entry may have expired (its TTL ran
      // out in between: a restart right after a crash) or been deleted, or that stalled predecessor
      // beat once more: taken over all the same. Any other incarnation there is a process starting
      // at the same time, which wins.
      const { revision, held } = await this.readEntryAtLeader();
      if (held && held.incarnation !== this.predecessor) throw conflict();
      this.revision = revision;
      try {
        await this.write();
      } catch (again) {
        if (isWrongRevision(again)) throw conflict();
        throw again;
      }
    }
    this.timer = setInterval(() => this.tick(false), this.heartbeatMs);
    this.timer.unref();
    // Back from a NATS outage, the subscriptions are live again at once: learn now, not a
    // heartbeat later, whether another process took the name meanwhile. Even past a beat still in
    // flight: its request may have died with the old connection and only time out.
    const watch = this.nc.status();
    this.statusWatch = watch;
    void (async () => {
      for await (const status of watch) if (status.type === "reconnect") this.tick(true);
    })();
  }

  /**
   * Beats one at a time, so a NATS outage does not pile up requests that all wait for their
   * timeout; but each is given up after a heartbeat period, and a tick meanwhile is not skipped:
   * waiting out a slow put (nats.js' 5 s timeout) and skipping the ticks meanwhile let the entry
   * go unrefreshed for the whole TTL. A reconnect beats at once: the beat in flight may have died
   * with the old connection and only time out. A put of a beat given up may still land; as every
   * put is a compare-and-set on the revision, it never lands over a later one (which then reads
   * the entry and writes again), and only the current beat records the revision it gets.
   */
  private tick(reconnected: boolean): void {
    if (this.isLost || this.stopped) return;
    if (this.beatInFlight && !reconnected) {
      this.beatDue = true;
      return;
    }
    this.beatDue = false;
    this.beatInFlight = true;
    const serial = ++this.beatSerial;
    const current = () => serial === this.beatSerial && !this.stopped && !this.isLost;
    within(this.refresh(current, this.beatTimeoutMs), this.heartbeatMs)
      .then(
        () => {
          if (current()) this.beatFailures.succeeded();
        },
        (error: unknown) => {
          // A beat still in flight when stop() came (its request timing out, NATS down), or overtaken: nothing to tell.
          if (!current()) return;
          // The bucket may be gone (deleted by an operator, or a NATS restart without its store):
          // the next beat creates it again instead of failing forever.
          this.kv = undefined;
          this.beatFailures.failed(error, `membership heartbeat failed; tried again every ${this.heartbeatMs} ms (the coordinator leaves this participant out once ${MEMBER_TTL_MS} ms pass without one)`);
        },
      )
      .finally(() => {
        // Overtaken by a reconnect's beat: that one's end counts.
        if (serial !== this.beatSerial) return;
        // Whatever of this beat still runs (a request given up on) records nothing now.
        this.beatSerial += 1;
        this.beatInFlight = false;
        if (this.beatDue) this.tick(false);
      });
  }

  /**
   * Whether a participant answers on this participant's status subject: a status reply naming this
   * kind/instance, or a catalog refusal (the probe carries no token, so a live one answers
   * `unauthorized`). Subscribers that stay silent (a monitoring tap, `nats sub '>'`) or answer
   * something else (`nats reply`) are not participants: counting them refused every restart while
   * they listened. A participant too stalled to answer within the probe is taken over like a gone
   * one; when it wakes, its heartbeat finds this incarnation in the entry and it stops (`lost`).
   */
  private async someoneAnswers(): Promise<boolean> {
    const subject = participantSubject(this.deployment, this.member.kind, this.member.instance, "status");
    let otherReplies = false;
    try {
      // Every reply within the probe, not the first: another subscriber's reply must not hide a participant's.
      const replies = await this.nc.requestMany(subject, "", { strategy: "timer", maxWait: PROBE_TIMEOUT_MS });
      for await (const reply of replies) {
        otherReplies = true;
        if (isParticipantReply(reply.data, this.member.kind, this.member.instance)) return true;
      }
    } catch (error) {
      if (!isNoResponders(error)) throw error;
      return false;
    }
    this.logger?.warn(
      { subject, non_participant_replies: otherReplies },
      "something subscribed to this participant's status subject (no 'no responders') but no participant answered the probe: a monitoring tap, or a predecessor too stalled to answer, which stops when it wakes",
    );
    return false;
  }

  /**
   * The registry entry now, as the stream's leader holds it (the bucket created first if missing):
   * its revision (0: none) and the member it announces, if it parses. Not the KV's direct get, which
   * any replica answers: one lagging behind the predecessor's entry would make that predecessor
   * nobody, and `start()` would take its entry at the leader for another process starting.
   */
  private async readEntry(): Promise<{ revision: number; held: Member | undefined }> {
    this.kv ??= await this.openBucket();
    return this.readEntryAtLeader();
  }

  /** `timeout`: of each JetStream request (a beat's); nats.js' default (5 s) when not given. */
  private async openBucket(timeout?: number): Promise<KV> {
    const bucket = membersBucket(this.deployment);
    // The coordinator asserts this config (and scales replicas) when it opens the bucket; same rule here.
    const kv = await new Kvm(timeout === undefined ? this.nc : jetstream(this.nc, { timeout })).create(bucket, { history: 1, ttl: MEMBER_TTL_MS, replicas: kvReplicas(this.nc.info) });
    // Another process may be creating it this moment: its entry is read at the stream's leader next.
    await awaitBucketStore(this.nc, bucket);
    this.hooks?.onBucketOpened?.(kv);
    return kv;
  }

  /**
   * Compare-and-set on the revision last seen: never overwrites another process's entry, nor a
   * later put of this one. `current()` false (a beat given up): the revision it got is not recorded.
   * `timeout`: of each request (a beat's), nats.js' default when not given.
   */
  private async write(current: () => boolean = () => true, timeout?: number): Promise<void> {
    this.kv ??= await this.openBucket(timeout);
    if (!current()) return;
    this.member.heartbeat_at = Date.now() / 1000;
    const value = JSON.stringify(this.member);
    // previousSeq 0: only when there is no entry (what kv.create() sends first; it takes no timeout).
    const revision = await this.kv.put(this.key, value, { previousSeq: this.revision ?? 0, timeout });
    if (current()) this.revision = revision;
  }

  /** One beat; it stops at the first step after `current()` turns false (given up, stopped, lost). */
  private async refresh(current: () => boolean, timeout: number): Promise<void> {
    try {
      await this.write(current, timeout);
      return;
    } catch (error) {
      if (!isWrongRevision(error)) throw error;
    }
    // Our entry expired (a long NATS outage), was deleted, the bucket was re-created, or another
    // process took the name over. Write it again unless another incarnation holds it now.
    const { revision, held } = await this.readEntryAtLeader(timeout);
    // stop() may have deleted the entry meanwhile: not to be written again. Given up: its
    // successor reads the entry itself.
    if (!current()) return;
    if (held && held.incarnation !== this.member.incarnation) {
      this.lose(held);
      return;
    }
    this.revision = revision;
    await this.write(current, timeout);
  }

  private lose(held: Member): void {
    this.isLost = true;
    this.stopWatching();
    const since = new Date(held.started_at * 1000).toISOString();
    const conflict = new CheckpointError(
      "instance_conflict",
      `another process (incarnation ${held.incarnation}, started ${since}) took over ${this.name} in deployment ${this.deployment} while this one (incarnation ${this.member.incarnation}) was cut off; this one stops serving it; run one process per kind/instance`,
    );
    this.logger?.error({ code: conflict.code, incarnation: this.member.incarnation, other_incarnation: held.incarnation }, "another process took over this kind/instance; no longer serving it");
    this.resolveLost(conflict);
  }

  /**
   * The entry as the stream's leader holds it. The KV's own get may be a direct get answered by
   * any replica, whose copy can lag: an older incarnation's entry read there would stop a healthy
   * process. `timeout`: of the request (a beat's), nats.js' default when not given.
   */
  private async readEntryAtLeader(timeout?: number): Promise<{ revision: number; held: Member | undefined }> {
    const jsm =
      timeout === undefined
        ? (this.jsm ??= await jetstreamManager(this.nc))
        : // No account-info request first: the beat needs none.
          (this.beatJsm ??= await jetstreamManager(this.nc, { timeout, checkAPI: false }));
    return this.readLeaderEntry(jsm);
  }

  /** `readEntryAtLeader()` through `jsm` (its request waits that manager's timeout). */
  private async readLeaderEntry(jsm: JetStreamManager): Promise<{ revision: number; held: Member | undefined }> {
    const bucket = membersBucket(this.deployment);
    const entry = await jsm.streams.getMessage(`KV_${bucket}`, { last_by_subj: `$KV.${bucket}.${this.key}` });
    if (!entry) return { revision: 0, held: undefined };
    // A delete or purge leaves a marker: no holder, but its sequence is what the next write replaces.
    if (entry.header?.get("KV-Operation")) return { revision: entry.seq, held: undefined };
    const parsed = MemberSchema.safeParse(safeJson(() => entry.json()));
    return { revision: entry.seq, held: parsed.success ? parsed.data : undefined };
  }

  private stopWatching(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    // nats.js's status iterator has stop(); its declared type is only AsyncIterable.
    (this.statusWatch as { stop?: () => void } | undefined)?.stop?.();
    this.statusWatch = undefined;
  }

  /** Stops announcing and deletes the entry, within STOP_DELETE_WAIT_MS. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.stopWatching();
    // Only our own entry: a process that took over keeps its announcement. Best effort: a stale
    // entry only expires with the bucket's TTL.
    if (this.isLost || !this.revision) return;
    // Monotonic: a wall-clock step (NTP, a VM resumed) must not stretch the bound to an hour or end it at once.
    const inTime = await this.deleteOwnEntry(performance.now() + STOP_DELETE_WAIT_MS);
    if (!inTime) this.logger?.warn({ wait_ms: STOP_DELETE_WAIT_MS, ttl_ms: MEMBER_TTL_MS }, "membership entry not deleted in time (NATS unreachable?); it expires with the registry's TTL");
  }

  /**
   * Deletes the entry if it is still ours, by `until` (performance.now()) as a whole: each request waits only what is
   * left, and none is sent after it. A beat in flight when stop() came may land first (the delete
   * is refused, the entry read again, the delete sent again): bounding each request alone let those
   * retries run on past stop(). False when time ran out; a request that failed otherwise is no
   * reason to wait either, and counts as in time if it failed before `until`.
   */
  private async deleteOwnEntry(until: number): Promise<boolean> {
    // A JetStream context per request, what is left as its timeout: kv.delete() takes none of its
    // own, and the bucket handle's (nats.js' 5 s, or a beat's) outlived stop(). Its own handle also
    // covers a failed beat's dropped one; bound without a request (no account info), never creating the bucket.
    const bounded = <T>(request: (js: JetStreamClient) => Promise<T>): Promise<T> => {
      const left = until - performance.now();
      if (left <= 0) return Promise.reject(new errors.TimeoutError());
      return request(jetstream(this.nc, { timeout: left, checkAPI: false }));
    };
    const inTime = (error: unknown) => !(error instanceof errors.TimeoutError) && performance.now() < until;
    const bucket = membersBucket(this.deployment);
    for (let tries = 0; tries < 3; tries++) {
      try {
        await bounded(async (js) => (await new Kvm(js).open(bucket)).delete(this.key, { previousSeq: this.revision }));
        return true;
      } catch (error) {
        if (!isWrongRevision(error)) return inTime(error);
      }
      // A heartbeat in flight landed first (a new revision): delete the entry if it is still ours.
      let entry: { revision: number; held: Member | undefined };
      try {
        entry = await bounded(async (js) => this.readLeaderEntry(await js.jetstreamManager()));
      } catch (error) {
        return inTime(error);
      }
      if (entry.held?.incarnation !== this.member.incarnation) return true;
      this.revision = entry.revision;
    }
    return true;
  }
}

function safeJson(read: () => unknown): unknown {
  try {
    return read();
  } catch {
    return undefined;
  }
}

/** A reply only a participant's control endpoint sends to an unauthenticated status request. */
function isParticipantReply(data: Uint8Array, kind: Kind, instance: string): boolean {
  const body = safeJson(() => JSON.parse(Buffer.from(data).toString("utf8")));
  if (ErrorReplySchema.safeParse(body).success) return true;
  const status = StatusReplySchema.safeParse(body);
  return status.success && status.data.kind === kind && status.data.instance === instance;
}
