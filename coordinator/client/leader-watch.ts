import { Kvm, type KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { awaitBucketStore, CheckpointError, decodeLeaseValue, LEADER_KEY, leaderBucket, MIN_LEASE_MS, within, type LeaseHolder } from "../../protocol/index.js";
import { pollUntil } from "./poll-until.js";

/**
 * How often a waiting client re-reads the leader lease at most: one lease period at the default
 * lease_ms. A shorter lease (the leader bucket's max_age) is re-read every period instead, so a
 * failover under it is noticed about when the lease lapses, not seconds after.
 */
export const LEADER_CHECK_MS = 5_000;

/**
 * How long a read naming a serving leader also stands for the ops sent after it: half the shortest
 * lease period a coordinator accepts (`MIN_LEASE_MS`). A term created after the read serves only
 * once it has waited a whole lease period, so an op sent within this window and delivered within
 * the other half reaches the term read or none that answers, exactly what a read beside it would
 * have said. A disconnect ends the window (ops queued while reconnecting may be delivered late).
 * Ops sent in quick succession (a controller's fine-grained ops, a benchmark) then cost one KV
 * read per window, not one each.
 */
export const LEASE_READ_REUSE_MS = MIN_LEASE_MS / 2;

/**
 * A watch's lease read that has not answered in this long counts as unreadable: one sent while the
 * connection was down waits out JetStream's 5 s request timeout even when the server is back (and
 * answers a fresh read in milliseconds) within a second. A read normally takes a millisecond or two.
 */
export const LEASE_READ_BOUND_MS = 1_000;

/** How often an op whose lease read failed reads it again until one succeeds (a NATS restart: about a second). */
export const UNREAD_LEASE_RETRY_MS = 250;

export type { LeaseHolder };

/**
 * The coordinator leading `deployment`, as its lease in the leader bucket names it: its id and
 * term, null when nobody leads, undefined when the lease cannot be read (no JetStream permissions,
 * a timeout).
 */
export class LeaderLeaseReader {
  private kv: KV | undefined;
  /** Whether the bucket's store is known to exist, so its reads cannot meet a stream being created. */
  private storeReady = false;
  /** The last read that named a serving leader, with when it was sent (monotonic ms). */
  private lastServing: { holder: LeaseHolder; sentAt: number } | undefined;
  private watchingStatus = false;
  /** The last term a read named serving, however long ago and across disconnects: `watchOp`'s fallback. */
  private lastServingTerm: LeaseHolder | undefined;
  /** The lease period (the bucket's max_age, ms) as read when the bucket was opened; undefined until then or unread. */
  private leaseMs: number | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly deployment: string,
    /** Monotonic milliseconds (tests move it). */
    private readonly now: () => number = () => performance.now(),
  ) {}

  /**
   * The leader as an op sent now finds it: a read sent within `LEASE_READ_REUSE_MS` that named a
   * serving leader, else a fresh read (`leader`). Only a serving holder is reused: a term read before
   * it served may start serving within the window and take the op, which that read would call lost.
   */
  async leaderAsSent(stop?: AbortSignal): Promise<LeaseHolder | null | undefined> {
    this.forgetOnDisconnect();
    const kept = this.lastServing;
    if (kept && this.now() - kept.sentAt < LEASE_READ_REUSE_MS) return kept.holder;
    return this.leader(stop);
  }

  /**
   * Resolves with `outcome_unknown` once leadership moved away from the term that took an op sent
   * now (see `lost`), until `stop` aborts (the reply came). The term is the read beside the op
   * (`leaderAsSent`); or, when the lease cannot be read then (NATS restarting, JetStream not back
   * yet), the last term a read named serving before the op, checked as soon as the lease reads
   * again (every UNREAD_LEASE_RETRY_MS): the same term then led all along, so it took the op;
   * another term means leadership moved around the op. Without it, an op sent into a NATS restart
   * that moved the lease waited out its whole timeout (a collector's prepare: the checkpoint
   * timeout and slack, every row paused). Never known to serve: the first read that succeeds.
   */
  async watchOp(stop: AbortSignal, everyMs: () => number): Promise<CheckpointError> {
    const before = this.lastServingTerm;
    const asSent = await within(this.leaderAsSent(stop), LEASE_READ_BOUND_MS).catch(() => undefined);
    if (asSent !== undefined) return this.lost(asSent, everyMs(), stop, "later");
    const later = await pollUntil(() => this.leaderWithin(stop, LEASE_READ_BOUND_MS), UNREAD_LEASE_RETRY_MS, stop, "later");
    return this.lost(before ?? later, everyMs(), stop, before ? "now" : "later");
  }

  /** `leader`, unreadable (undefined) once `ms` pass unanswered (see LEASE_READ_BOUND_MS). */
  private leaderWithin(stop: AbortSignal, ms: number): Promise<LeaseHolder | null | undefined> {
    return within(this.leader(stop), ms).catch(() => undefined);
  }

  /** Drops the kept read at every disconnect and reconnect of the connection, for as long as it lives. */
  private forgetOnDisconnect(): void {
    if (this.watchingStatus) return;
    this.watchingStatus = true;
    void (async () => {
      for await (const status of this.nc.status()) {
        if (status.type === "disconnect" || status.type === "reconnect") this.lastServing = undefined;
      }
    })().catch(() => undefined);
  }

  /**
   * `stop`: the reply came, so the read is moot. Nothing more is sent once it aborts: a request
   * issued while the connection closes keeps its timer (JetStream's 5 s) and the process alive.
   */
  async leader(stop?: AbortSignal): Promise<LeaseHolder | null | undefined> {
    try {
      // The coordinator may be creating the bucket this moment (see awaitBucketStore).
      if (!this.storeReady) {
        const store = await awaitBucketStore(this.nc, leaderBucket(this.deployment), undefined, stop);
        if (store === "missing") return undefined; // no coordinator started yet: unreadable, as the read's own "not found" was
        this.storeReady = store === "ready";
      }
      if (stop?.aborted) return undefined;
      // open() binds without direct gets, so reads ask the stream's leader, never a lagging replica.
      let periodRead: Promise<void> | undefined;
      if (!this.kv) {
        this.kv = await new Kvm(this.nc).open(leaderBucket(this.deployment));
        // Once per client, beside the first read: what checkEveryMs polls at (unread, the default
        // stands). Not sent once `stop` aborted (see above: it would keep a closing process alive).
        if (!stop?.aborted) {
          periodRead = this.kv.status().then(
            (status) => void (this.leaseMs = status.ttl > 0 ? status.ttl : undefined),
            () => undefined,
          );
        }
      }
      const sentAt = this.now();
      const [entry] = await Promise.all([this.kv.get(LEADER_KEY), periodRead]);
      if (!entry || entry.operation !== "PUT") return null;
      const holder = decodeLeaseValue(entry.string());
      if (holder?.serving === true) {
        this.lastServing = { holder, sentAt };
        this.lastServingTerm = holder;
      }
      return holder;
    } catch {
      return undefined;
    }
  }

  /** How often `lost` re-reads the lease by default: the lease period, at least MIN_LEASE_MS, at most LEADER_CHECK_MS. */
  checkEveryMs(): number {
    return this.leaseMs === undefined ? LEADER_CHECK_MS : Math.min(LEADER_CHECK_MS, Math.max(MIN_LEASE_MS, this.leaseMs));
  }

  /**
   * Resolves with `outcome_unknown` once the lease no longer names `leader`'s term (it stopped
   * leading: killed, partitioned, demoted; also when the same id leads again in a new term, which
   * never saw the request), re-read every `everyMs` until `stop` aborts. When nobody led as the
   * request was sent (`leader` null), or the term that led did not serve yet (a new leader waits one
   * lease period and recovers before it subscribes), no coordinator that answers took it: only a
   * frozen predecessor still subscribed can have, and it stays silent once it wakes. That is
   * `outcome_unknown` at the first check that reads the lease. (A new leader marks the lease
   * serving just after it subscribes: a request it took in between ends so too, safely, since a
   * retry gets its answer.) An op without a deadline may
   * legitimately run as long as the coordinator's default timeout, which a client does not know;
   * without this, a client whose coordinator died would wait for the 7-day cap. A read unanswered
   * within a period counts as unreadable, so one stuck read does not put off the next.
   */
  private lost(leader: LeaseHolder | null, everyMs: number, stop: AbortSignal, first: "now" | "later"): Promise<CheckpointError> {
    return pollUntil(
      async () => {
        const now = await this.leaderWithin(stop, everyMs);
        // Unreadable (undefined): checked again next time, never taken for a loss.
        if (now === undefined) return undefined;
        if (leader === null || leader.serving === false) {
          const then = leader === null ? "no coordinator led" : `coordinator ${leader.id} did not serve the controller API yet (a new leader waits one lease period and recovers first)`;
          return new CheckpointError("outcome_unknown", `${then} when the op was sent, so no coordinator that answers took it; retry the op to learn its outcome`);
        }
        const sameTerm = now !== null && now.id === leader.id && now.term === leader.term;
        if (sameTerm) return undefined;
        const why = now === null ? "nobody leads now" : now.id === leader.id ? "it leads again in a new term, which never saw the op" : `${now.id} leads now`;
        return new CheckpointError("outcome_unknown", `coordinator ${leader.id} stopped leading before it answered (${why}); retry the op to learn its outcome`);
      },
      everyMs,
      stop,
      first,
    );
  }
}
