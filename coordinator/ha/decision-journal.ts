import type { KV, KvEntry } from "@nats-io/kv";
import { jetstream, jetstreamManager, type JetStreamManager, type JetStreamOptions, type StoredMsg } from "@nats-io/jetstream";
import { Empty, headers, type NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { z } from "zod";
import {
  isPassableEpoch,
  CheckpointError,
  CheckpointIdSchema,
  ControllerStateInputSchema,
  describeZodError,
  EpisodeIdSchema,
  IncarnationSchema,
  InstanceSchema,
  isWrongRevision,
  KindSchema,
  MAX_CONTROL_MESSAGE_BYTES,
  journalBucket,
} from "../../protocol/index.js";
import { openBucketAsserted, readsFromStreamLeader } from "../membership/kv-bucket.js";
import { latestEntries } from "../membership/kv-latest-entries.js";

/**
 * The durable record of one checkpoint the coordinator is driving, keyed by checkpoint id:
 *   open       prepare was sent; recovery resumes everyone (presumed abort), after taking back a
 *              checkpoint.json its directory holds (an aborted publication's its leader could not)
 *   decided    the commit decision; recovery re-drives commit (idempotent), then completes
 *   published  (accepted for completeness) a decided entry whose checkpoint.json exists is treated
 *              the same way, so publication needs no journal write: recovery sends no resume; it
 *              keeps the checkpoint open (published) while a participant may hold it, else closes it
 *   restoring  restore was sent; recovery sends it again (participants that restored answer from
 *              their reply cache): all restored → restored; else the clean-up (restore_cleanup)
 *   restored   every participant restored; recovery closes it without a message when no member's
 *              status shows it still holding it (it outlived its processes: restarted, or resumed
 *              by their lease); else sends it again to rebuild the reply (a retry gets it), then
 *              keeps it for the controller to resume
 *   resuming   a restored checkpoint's resume was being sent: recovery finishes it (a success; its
 *              retried resume answers ok), whatever the members' statuses show
 *   restore_cleanup
 *              a failed restore's all-or-nothing clean-up began (or a restored one's resume found a
 *              member restarted): recovery finishes it, retiring attempt+1 at `retire_at` and then
 *              resuming everyone; never re-driven (a participant's retire keeps its restore reply,
 *              so a re-sent restore would look restored where attempt+1 was already retired)
 * The entry is removed once everyone was resumed (an aborted one's once its checkpoint.json is
 * taken back: kept `open` until then); a restore's removal records how it settled
 * (RestoreOutcomeRecordSchema), for a leader of a later term answering its resume retried.
 */
export const JournalEntrySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    epoch: z.number().int().min(0),
    state: z.enum(["open", "decided", "published", "restoring", "restored", "resuming", "restore_cleanup"]),
    participants: z.array(z.object({ kind: KindSchema, instance: InstanceSchema }).strict()),
    prepared_at: z.number(),
    checkpoint_dir: z.string().nullable(),
    scope: z.array(EpisodeIdSchema).nullable(),
    stop: z.boolean(),
    restarts: z.array(z.string()),
    /** Set by the convenience `checkpoint` op: recovery publishes and resumes after commit. */
    auto_publish: z.boolean(),
    controller_state: ControllerStateInputSchema.nullable(),
    /**
     * restore_cleanup only: the members where attempt+1 is retired, those the restore may have
     * installed it at (a participant that refused it keeps its attempts). Absent: every member.
     */
    retire_at: z.array(z.object({ kind: KindSchema, instance: InstanceSchema }).strict()).optional(),
    /**
     * Of a restored (or resuming) checkpoint: the process incarnation that restored it, per
     * `kind.instance`, so a successor's resume is addressed to those and a restarted one is found.
     */
    incarnations: z.record(z.string(), IncarnationSchema).optional(),
    /**
     * Alongside `incarnations`: the membership view's incarnation when the restore opened, of the
     * members it differs for (a view lagging behind a process that restarted before the restore), so
     * a successor whose view still lags takes it for lagging, not for a restart since the restore.
     */
    viewed: z.record(z.string(), IncarnationSchema).optional(),
    /**
     * The order checkpoints opened in, which recovery sorts by (oldest first): the epoch of the
     * coordinator that opened it and that coordinator's count of checkpoints opened (one epoch is
     * one process, so the pair only grows). Written when the entry is first written and kept by
     * every rewrite, a successor's too: `epoch` is the last writer's and `prepared_at` a wall clock
     * that may step back, so neither orders them. Absent (an entry of a coordinator older than this one): `epoch`
     * then `prepared_at`, before any entry that has them in the same epoch; a rewrite then keeps
     * that `epoch` as `opened_epoch`, with no `opened_seq`.
     */
    opened_epoch: z.number().int().min(0).optional(),
    opened_seq: z.number().int().min(1).optional(),
    updated_at: z.number(),
  })
  .strict();
export type JournalEntry = z.infer<typeof JournalEntrySchema>;

/**
 * An entry must fit one NATS message, and the commit and restore messages carry the same scope:
 * the headroom covers their other fields and headers (a bound of about 20k episodes in a scope).
 */
export const MAX_JOURNAL_ENTRY_BYTES = MAX_CONTROL_MESSAGE_BYTES - 16 * 1024;

/**
 * Refuses an entry too large to journal with `payload_too_large`. The engine calls it before it
 * changes anything (nothing sent, nothing opened), so an oversized scope or controller state is a
 * clean refusal rather than a checkpoint stuck half-way.
 */
export function assertJournalEntryFits(entry: JournalEntry): string {
  const text = JSON.stringify(entry);
  const size = Buffer.byteLength(text);
  if (size > MAX_JOURNAL_ENTRY_BYTES) {
    throw new CheckpointError(
      "payload_too_large",
      `checkpoint ${entry.checkpoint_id}: its journal entry (scope, restarts, inline controller state, members) is ${size} bytes; the limit is ${MAX_JOURNAL_ENTRY_BYTES}`,
    );
  }
  return text;
}

/** How a restore of a checkpoint id settled: resumed after it restored everywhere, or cleaned up. */
export type RestoreOutcome = "restored" | "restore_failed";

/**
 * What a restore's entry removal leaves in the journal (the purge marker's body): how it settled,
 * for a leader of a later term answering that restore's resume retried (its own memory of the id
 * may predate it). A plain removal (every checkpoint's) leaves no body.
 */
export const RestoreOutcomeRecordSchema = z.object({ restore: z.enum(["restored", "restore_failed"]) }).strict();

export interface DecisionJournal {
  /** Durably records the entry; resolves only after the server acknowledged it. */
  record(entry: JournalEntry): Promise<void>;
  /** `outcome`: a settled restore's, kept with the removal (see restoreOutcome). */
  remove(checkpointId: string, outcome?: RestoreOutcome): Promise<void>;
  list(): Promise<JournalEntry[]>;
  /**
   * How the last restore of the id settled, as the removal of its entry recorded it; undefined when
   * the key holds an entry, nothing, a plain removal's marker, or the record was compacted away
   * (its checkpoint deleted by retention).
   */
  restoreOutcome(checkpointId: string): Promise<RestoreOutcome | undefined>;
}

/** A write in doubt: the value it wrote, or REMOVAL for a purge. */
const REMOVAL = Symbol("removal");
type Doubt = string | typeof REMOVAL;

/** Whether the key's latest message (null: none) is what `doubt` would have left. */
function holds(doubt: Doubt | undefined, now: { removed: boolean; value: () => string } | null): boolean {
  if (doubt === undefined) return false;
  // A removal landed if the key holds no entry: its marker (or nothing, once compaction dropped it).
  if (doubt === REMOVAL) return now === null || now.removed;
  return now !== null && !now.removed && now.value() === doubt;
}

/**
 * How long a removed entry's purge marker stays before compaction drops it. A restore's marker,
 * which records its outcome, stays longer: see KvDecisionJournal.open's `inCatalog`.
 */
const MARKER_KEEP_MS = 30 * 60_000;
/** A long-lived leader compacts every this many removals (a recovery's listing also does). */
const COMPACT_EVERY_REMOVALS = 128;

/**
 * The journal in a JetStream KV bucket without TTL (history 1); entries survive coordinator crashes.
 *
 * Every write is a compare-and-set on the revision this coordinator last wrote or read for the key
 * (`list`, which recovery calls at the start of each leadership term, starts afresh): a deposed
 * leader's write still in flight when a successor recovered, rewrote or removed the entry is
 * refused by the server (`not_leader`), instead of bringing back a state the successor moved past.
 */
export class KvDecisionJournal implements DecisionJournal {
  private readonly revisions = new Map<string, number>();
  /**
   * Per key, the value of this coordinator's last write whose outcome stayed unknown (its
   * acknowledgement lost, and not seen landed when the key was read back), or REMOVAL for such a
   * purge: the server may still apply it, and the compare-and-set refusal that follows is then no
   * other coordinator's doing. A create's stays through a removal that failed: it may land yet.
   */
  private readonly inDoubt = new Map<string, Doubt>();
  private jsm: JetStreamManager | undefined;
  /** Writes of one key go one after another: each compares against the revision the last one left. */
  private readonly queues = new Map<string, Promise<unknown>>();
  private removals = 0;
  private compacting: Promise<void> | undefined;

  private constructor(
    private readonly nc: NatsConnection,
    private readonly bucket: string,
    private readonly kv: KV,
    private readonly options: { logger?: Logger; markerKeepMs: number; inCatalog?: (checkpointId: string) => boolean; jsOptions: JetStreamOptions },
  ) {}

  /**
   * `markerKeepMs`: how long a removed entry's purge marker stays (default 30 min). One that records
   * a restore's outcome stays, however old, for as long as `inCatalog` says the checkpoint is there
   * (retention has not deleted it): while it is, the id can be restored again and a resume of it
   * retried, and a leader without the record would answer from a memory a successor's restore may
   * have outdated. A throw (the storage unmounted) tells nothing: kept. Without `inCatalog` (a tool,
   * which cannot tell), every such record is kept.
   * `requestTimeoutMs`: how long each of the journal's JetStream requests waits for its answer
   * (nats.js' default, 5 s, when not given); a write unanswered by then is in doubt (see fenced).
   */
  static async open(
    nc: NatsConnection,
    deployment: string,
    logger?: Logger,
    markerKeepMs = MARKER_KEEP_MS,
    inCatalog?: (checkpointId: string) => boolean,
    requestTimeoutMs?: number,
  ): Promise<KvDecisionJournal> {
    const bucket = journalBucket(deployment);
    const jsOptions: JetStreamOptions = requestTimeoutMs === undefined ? {} : { timeout: requestTimeoutMs };
    // Entries are removed by kv.purge and their markers dropped by stream purges: see remove, compactMarkers.
    const kv = await openBucketAsserted(nc, bucket, { history: 1, ttl: 0, purges: "keys", requestTimeoutMs });
    // Every read asks the stream's leader: in an R3 bucket a direct get may be answered by a replica
    // that lags, whose copy would have a recovery miss a decided entry (presumed abort), act on one
    // removed, or write against a stale revision (refused not_leader), and a removal's read-back
    // take an entry still there for removed. The journal is read at recovery, after a lost
    // acknowledgement, and for a restore's outcome record (restoreOutcome: restores are rare), so
    // the leader's load stays small.
    readsFromStreamLeader(kv);
    return new KvDecisionJournal(nc, bucket, kv, { logger: logger?.child({ module: "journal" }), markerKeepMs, inCatalog, jsOptions });
  }

  private get logger(): Logger | undefined {
    return this.options.logger;
  }

  /**
   * Drops the purge markers removed entries left (one per closed checkpoint, for ever in a bucket
   * without TTL, and walked by every recovery's listing) once older than `markerKeepMs`; a
   * restore's (its outcome record) only once its checkpoint also left the catalog; one under a key
   * that is no checkpoint id (nothing this journal wrote) at the plain markers' age. Each is
   * purged up to its own revision only, so a later write of the same key (a restore of that id)
   * survives; a deposed leader's write naming an older revision is still refused, as the key's
   * revision no longer matches. Runs once at a time, in the background; a failure is logged.
   */
  compactMarkers(): Promise<void> {
    this.compacting ??= this.dropOldMarkers()
      .catch((error: unknown) => this.logger?.warn({ err: error }, "journal_marker_compaction_failed"))
      .finally(() => (this.compacting = undefined));
    return this.compacting;
  }

  private async dropOldMarkers(): Promise<void> {
    const now = Date.now();
    const unreadable: { key: string; error: unknown }[] = [];
    const old = (await latestEntries(this.kv)).filter((e) => e.operation !== "PUT" && e.created.getTime() <= now - this.options.markerKeepMs);
    // A key that is no checkpoint id names no checkpoint a restore could outlive: nothing this journal
    // wrote (a hand-written marker, a buggy version's), which the catalog would refuse to look up.
    // Dropped at the plain markers' age, whatever its body, and named once it went.
    // A set: recovery's compaction walks every old marker, and a buggy writer may have left many.
    const invalidIds = new Set(old.filter((e) => !CheckpointIdSchema.safeParse(e.key).success).map((e) => e.key));
    // A restore's marker (it has a body: its outcome) also waits for its checkpoint to leave the catalog.
    const dropped = old.filter((e) => e.length === 0 || invalidIds.has(e.key) || this.checkpointGone(e.key, unreadable));
    // One line per compaction: while the root is unmounted every record is kept, and one each was a flood.
    if (unreadable.length) {
      this.logger?.warn({ records: unreadable.length, keys: unreadable.slice(0, 10).map((u) => u.key), err: unreadable[0]!.error }, "journal_restore_outcomes_kept_catalog_unreadable");
    }
    if (dropped.length === 0) return;
    const jsm = await jetstreamManager(this.nc, this.options.jsOptions);
    for (const { key, revision } of dropped) await jsm.streams.purge(`KV_${this.bucket}`, { filter: `$KV.${this.bucket}.${key}`, seq: revision + 1 });
    // Once purged: a purge that fails is logged as the compaction's failure, and tried again next time.
    if (invalidIds.size) this.logger?.warn({ markers: invalidIds.size, keys: [...invalidIds].slice(0, 10) }, "journal_markers_of_invalid_ids_dropped");
    this.logger?.info({ markers: dropped.length }, "journal_markers_dropped");
  }

  /** Whether a restore's outcome record may go: its checkpoint left the catalog (see open). A throw keeps it, noted in `unreadable`. */
  private checkpointGone(key: string, unreadable: { key: string; error: unknown }[]): boolean {
    const { inCatalog } = this.options;
    if (!inCatalog) return false;
    try {
      return !inCatalog(key);
    } catch (error) {
      unreadable.push({ key, error });
      return false;
    }
  }

  async record(entry: JournalEntry): Promise<void> {
    const key = entry.checkpoint_id;
    const value = assertJournalEntryFits(JournalEntrySchema.parse(entry));
    await this.fenced(
      key,
      async (known) => {
        // create: a key nobody holds (or one removed: its purge marker is taken over).
        this.revisions.set(key, known === undefined ? await this.kv.create(key, value) : await this.kv.update(key, value, known));
      },
      // Landed if the key now holds exactly this value (entries carry their time, so no other write does).
      (now) => {
        if (now?.operation === "PUT" && now.string() === value) this.revisions.set(key, now.revision);
      },
      () => value,
    );
  }

  async remove(checkpointId: string, outcome?: RestoreOutcome): Promise<void> {
    // A restore's removal carries its outcome in the marker's body (the same one message): a plain one stays empty.
    const body = outcome === undefined ? Empty : new TextEncoder().encode(JSON.stringify(RestoreOutcomeRecordSchema.parse({ restore: outcome })));
    // The value of this coordinator's create in doubt, when no revision of the key is known: it stays
    // the doubt if this attempt fails, as the create may land yet (or have landed) whatever it wrote.
    let created: string | undefined;
    await this.fenced(
      checkpointId,
      async (known) => {
        created = undefined;
        if (known === undefined) {
          const doubt = this.inDoubt.get(checkpointId);
          // Never written or read here, and no create in doubt: nothing of this coordinator's to remove.
          if (typeof doubt !== "string") return;
          // A create in doubt (no message for the key, or a removed entry's marker, taken over) may
          // have landed after its read-back, or land yet. The leader's latest message tells: this
          // value is purged at its revision; where no entry is, a purge marker at that revision
          // fences the late create out (it expects the same revision); another's entry is not ours.
          created = doubt;
          const now = await this.latestAtLeader(checkpointId);
          const removed = now === null || !!now.header?.get("KV-Operation");
          if (!removed && now.string() !== doubt) return;
          await this.purgeAt(checkpointId, now?.seq ?? 0, body);
          return;
        }
        // kv.purge carries no body: a restore's outcome goes through purgeAt (the same message otherwise).
        if (outcome === undefined) await this.kv.purge(checkpointId, { previousSeq: known });
        else await this.purgeAt(checkpointId, known, body);
        this.revisions.delete(checkpointId);
        if (++this.removals % COMPACT_EVERY_REMOVALS === 0) void this.compactMarkers();
      },
      (now) => {
        if (!now || now.operation !== "PUT") this.revisions.delete(checkpointId);
        // The create in doubt landed (and the marker was not written): the removal's retry purges it.
        else if (created !== undefined && now.string() === created) this.revisions.set(checkpointId, now.revision);
      },
      () => created ?? REMOVAL,
    );
  }

  /**
   * kv.purge, but also at revision 0 ("no message for the key"), which kv.purge does not send, and
   * with a body (a restore's outcome), which kv.purge does not carry.
   */
  private async purgeAt(key: string, revision: number, body: Uint8Array = Empty): Promise<void> {
    const h = headers();
    h.set("KV-Operation", "PURGE");
    h.set("Nats-Rollup", "sub");
    await jetstream(this.nc, this.options.jsOptions).publish(`$KV.${this.bucket}.${key}`, body, { headers: h, expect: { lastSubjectSequence: revision } });
  }

  async restoreOutcome(checkpointId: string): Promise<RestoreOutcome | undefined> {
    // At the stream's leader: a lagging replica may not have the successor's removal yet.
    const now = await this.latestAtLeader(checkpointId);
    if (!now?.header?.get("KV-Operation") || now.data.length === 0) return undefined;
    let value: unknown;
    try {
      value = now.json();
    } catch {
      value = undefined;
    }
    const parsed = RestoreOutcomeRecordSchema.safeParse(value);
    // Not one this journal wrote: no record, as for a plain removal (logged).
    if (!parsed.success) {
      this.logger?.error({ key: checkpointId, revision: now.seq, bytes: now.data.length }, "journal_restore_outcome_invalid_ignored");
      return undefined;
    }
    return parsed.data.restore;
  }

  /** The key's latest message (null: none) at the stream's leader: a replica's direct get may lag. */
  private async latestAtLeader(key: string): Promise<StoredMsg | null> {
    this.jsm ??= await jetstreamManager(this.nc, this.options.jsOptions);
    return this.jsm.streams.getMessage(`KV_${this.bucket}`, { last_by_subj: `$KV.${this.bucket}.${key}` });
  }

  async list(): Promise<JournalEntry[]> {
    this.revisions.clear();
    const latest = await this.readEntries();
    // Each leadership term starts here: what its predecessors left is dropped beside recovery.
    void this.compactMarkers();
    for (const { key, revision } of latest) this.revisions.set(key, revision);
    return latest.flatMap((e) => (e.entry ? [e.entry] : [])).sort((a, b) => a.updated_at - b.updated_at);
  }

  /**
   * The highest epoch an entry carries (0: none), for the lease's epoch floor: a term that journaled
   * a decision may have published nothing, and the participants that saw its epoch may not answer
   * the new leader's probe in time, yet recovery re-drives that decision to them. Read only: the
   * revisions this coordinator writes against are left as they are. An entry whose epoch no later
   * one can pass (2^53 - 1, hand-edited) is left out, logged, as highestEpochSeen leaves out such a
   * participant: as the result, the floor would ignore it whole, the other entries' epochs with it.
   */
  async highestEpoch(): Promise<number> {
    let highest = 0;
    for (const { key, revision, entry } of await this.readEntries()) {
      if (!entry) continue;
      if (isPassableEpoch(entry.epoch)) highest = Math.max(highest, entry.epoch);
      else this.logger?.error({ key, revision, epoch: entry.epoch }, "journaled_epoch_out_of_range_ignored");
    }
    return highest;
  }

  /** Every key's latest value (removed ones left out), parsed; `entry` undefined where it is no entry. */
  private async readEntries(): Promise<{ key: string; revision: number; entry: JournalEntry | undefined }[]> {
    // A message nats.js cannot read (its key, its headers) is no entry this journal wrote: skipped like one that is not JSON.
    const latest = await latestEntries(this.kv, (key, err) => this.logger?.error({ key, err }, "journal_entry_unreadable_skipped"));
    return latest.flatMap((e) => {
      const key = e.key;
      if (e.operation !== "PUT") return [];
      // A value nothing here wrote (not JSON, or not an entry) cannot be acted on: skipped, and
      // logged each time, rather than failing recovery (and so every controller op) for good.
      let value: unknown;
      try {
        value = e.json();
      } catch {
        this.logger?.error({ key, revision: e.revision, bytes: e.length }, "journal_entry_not_json_skipped");
        return [{ key, revision: e.revision, entry: undefined }];
      }
      const parsed = JournalEntrySchema.safeParse(value);
      if (!parsed.success) this.logger?.error({ key, revision: e.revision, detail: describeZodError(parsed.error) }, "journal_entry_invalid_skipped");
      // Every entry is written under its own id: one under another key was put there by something
      // else, and acted on, its removal would purge its id's key, never this one (acted on again by
      // every recovery).
      else if (parsed.data.checkpoint_id !== key) {
        this.logger?.error({ key, revision: e.revision, checkpoint_id: parsed.data.checkpoint_id }, "journal_entry_other_key_skipped");
        return [{ key, revision: e.revision, entry: undefined }];
      }
      return [{ key, revision: e.revision, entry: parsed.success ? parsed.data : undefined }];
    });
  }

  /**
   * Runs `write` after the key's earlier writes, with the revision they left (undefined: none
   * known). A write whose outcome is unknown (its acknowledgement was lost) is reconciled with what
   * the key holds now (`landed`), so this coordinator's own write that did land never fences it out.
   */
  private fenced(key: string, write: (known: number | undefined) => Promise<void>, landed: (now: KvEntry | null) => void, doubtOf: () => Doubt): Promise<void> {
    const run = async (): Promise<void> => {
      for (let adopted = false; ; adopted = true) {
        try {
          await write(this.revisions.get(key));
          this.inDoubt.delete(key);
          return;
        } catch (error) {
          if (!isWrongRevision(error)) {
            const doubt = doubtOf();
            // Its outcome is unknown until a later read shows it (the server may apply it after the read below).
            this.inDoubt.set(key, doubt);
            await this.kv.get(key).then(
              (now) => {
                landed(now);
                if (holds(doubt, now && { removed: now.operation !== "PUT", value: () => now.string() })) this.inDoubt.delete(key);
              },
              () => undefined,
            ); // unreadable: the next write finds out
            throw error;
          }
          // Refused: by this coordinator's own write in doubt, landed after it was read back? Then
          // carry on from its revision (once); anything else is another coordinator's.
          if (!adopted && (await this.adoptLateWrite(key))) continue;
          // The stale revision stays: every later write of the key is refused the same way.
          throw new CheckpointError("not_leader", `journal entry ${key} was changed by another coordinator since this one last wrote or read it`, { cause: error });
        }
      }
    };
    const next = (this.queues.get(key) ?? Promise.resolve()).then(run, run);
    const settled = next.catch(() => undefined);
    this.queues.set(key, settled);
    void settled.then(() => {
      if (this.queues.get(key) === settled) this.queues.delete(key);
    });
    return next;
  }

  /**
   * Whether the key holds, at the stream's leader (a replica's direct get may lag), exactly what
   * this coordinator's write in doubt left: its value (entries carry their epoch and time, so no
   * other coordinator's write is equal), whose revision is then this coordinator's to write
   * against; or, for a removal, no entry (what the removal wanted, whoever's marker it is).
   */
  private async adoptLateWrite(key: string): Promise<boolean> {
    const doubt = this.inDoubt.get(key);
    if (doubt === undefined) return false;
    try {
      const now = await this.latestAtLeader(key);
      if (!holds(doubt, now && { removed: !!now.header?.get("KV-Operation"), value: () => now.string() })) return false;
      if (doubt === REMOVAL) this.revisions.delete(key);
      else this.revisions.set(key, now!.seq);
      this.inDoubt.delete(key);
      return true;
    } catch {
      return false;
    }
  }
}

/** In-memory journal for unit tests and single-process tools. */
export class MemoryDecisionJournal implements DecisionJournal {
  readonly entries = new Map<string, JournalEntry>();
  /** Per key, the outcome its last removal recorded, as the KV journal's latest marker keeps it. */
  readonly outcomes = new Map<string, RestoreOutcome>();
  readonly log: { op: "record" | "remove"; checkpoint_id: string; state?: JournalEntry["state"]; outcome?: RestoreOutcome }[] = [];
  async record(entry: JournalEntry): Promise<void> {
    assertJournalEntryFits(entry);
    this.entries.set(entry.checkpoint_id, JournalEntrySchema.parse(structuredClone(entry)));
    this.outcomes.delete(entry.checkpoint_id);
    this.log.push({ op: "record", checkpoint_id: entry.checkpoint_id, state: entry.state });
  }
  async remove(checkpointId: string, outcome?: RestoreOutcome): Promise<void> {
    // As the KV journal: a removal of nothing writes nothing.
    if (!this.entries.delete(checkpointId)) return void this.log.push({ op: "remove", checkpoint_id: checkpointId });
    if (outcome === undefined) this.outcomes.delete(checkpointId);
    else this.outcomes.set(checkpointId, outcome);
    this.log.push({ op: "remove", checkpoint_id: checkpointId, ...(outcome && { outcome }) });
  }
  async restoreOutcome(checkpointId: string): Promise<RestoreOutcome | undefined> {
    return this.entries.has(checkpointId) ? undefined : this.outcomes.get(checkpointId);
  }
  async list(): Promise<JournalEntry[]> {
    return [...this.entries.values()].sort((a, b) => a.updated_at - b.updated_at);
  }
}
