import { open } from "node:fs/promises";
import { z } from "zod";
import { CheckpointError, CheckpointIdSchema, EpisodeIdSchema, LineSplitter, namePath, type EpisodeId } from "../../protocol/index.js";
import { replaceFileDurably } from "../publication/durable-fs.js";
import { openRegularFile } from "../publication/regular-file.js";
import { CollectionFieldsSchema, collectionFields, fromCollectionFields, type CollectionIdentity } from "./collection-identity.js";
import { parseStateValue } from "./state-file-value.js";

/**
 * `dispatched.jsonl`: the run id on the first line (with `continues_run`, the earlier run whose
 * checkpoint this run restores at start, and the collection it belongs to: `tasks`, `out` and
 * `rollout_id_prefix`, which a start of another collection is refused or abandons), then one `{rollout_id, attempt}` line appended
 * just before each `/run` is sent, and one `{rollout_id, attempt, restored: true}` line per row a
 * restore continues as its next attempt (not sent yet), and one `{checkpoint_id}` line before each
 * checkpoint's prepare. After a crash it names every attempt that
 * may still be running somewhere, so the next run can retire them before sending replacements,
 * and every row it finished as a later attempt, whose fences the next run forgets (the forget was
 * queued in memory), and the checkpoints it started, which the next run may close (one it finds
 * open that no run of its own started is another controller's); a new log carries the finished
 * rows whose forget was not sent yet, and the checkpoint ids the log it replaces named: a
 * predecessor's prepare may still wait at the coordinator (behind another op) when a start reads
 * its status, and open only after this run replaced the log.
 * Each line is on disk (fdatasync) before its append returns, and only then does the `/run` go
 * out: a line lost on power loss would let the next run send that attempt again, unretired.
 * Appends made while a sync runs share the next one (group commit): concurrent dispatches cost one
 * sync per group, not one each.
 */
const HeaderSchema = z
  .object({
    run_id: z.string().min(1).max(128),
    continues_run: z.string().min(1).max(128).optional(),
    // Absent from a log written before the header named its collection (read as this one).
    ...CollectionFieldsSchema.partial().shape,
  })
  .strict();
const EntrySchema = EpisodeIdSchema.extend({ restored: z.literal(true).optional() }).strict();
const CheckpointLineSchema = z.object({ checkpoint_id: CheckpointIdSchema }).strict();
/** How recordCheckpoint's lines begin (JSON.stringify's spelling): the other lines are attempts. */
const CHECKPOINT_LINE = /^\{"checkpoint_id":/;

/**
 * No size limit: the log is streamed at start-up, keeping only the latest attempt per rollout, so
 * its size (one line per dispatch of the run, finished rows included) is no limit on how many rows
 * a collection that crashed can resume. A 256 MiB limit, read whole, would refuse a run of ~1.1 million
 * dispatches of 200-character rollout ids.
 */
const NO_SIZE_LIMIT = Number.MAX_SAFE_INTEGER;
/** Bytes read from the log at a time. */
const READ_CHUNK = 1 << 20;
/** Far more than any line the log holds (a rollout id is at most 200 characters). */
const MAX_LINE_BYTES = 64 << 10;

/** A logged attempt; `restored` = installed by a restore and not sent since. */
/** The dispatch log's name in the collector's --checkpoint-dir. */
export const DISPATCH_LOG_FILE = "dispatched.jsonl";

export type LoggedAttempt = EpisodeId & { restored?: true };

export interface DispatchHistory {
  runId: string;
  /** The earlier run whose checkpoint this run was restoring when it started (see Collector.start). */
  continuesRun?: string;
  /** The collection the log belongs to; undefined in a log written before the header named it. */
  collection?: CollectionIdentity;
  /** Latest logged attempt per rollout. */
  latest: Map<string, number>;
  /** Rollouts whose latest attempt was only restored, never sent. */
  restoredOnly: Set<string>;
  /** The checkpoints the run started (logged before their prepare). */
  checkpoints: Set<string>;
}

interface QueuedAppend {
  text: string;
  resolve: () => void;
  reject: (error: unknown) => void;
}

export class DispatchLog {
  /** Appends waiting for the next group write and sync. */
  private queued: QueuedAppend[] = [];
  private writing = false;
  /** A failed append whose cut failed too: the log is cut back to this length before the next append. */
  private cutTo: number | undefined;

  private constructor(
    readonly path: string,
    readonly runId: string,
    private readonly continuesRun: string | undefined,
    /** Checkpoint ids of earlier runs, written again by every replace: one may still open. */
    private readonly carriedCheckpoints: readonly string[],
    private readonly collection: CollectionIdentity | undefined,
  ) {}

  /**
   * Starts a fresh log for a new run, carrying forward attempts that must stay fenced, finished
   * ones still to forget, and the checkpoint ids earlier runs logged (`checkpoints`); its header
   * names `collection`.
   */
  static async create(
    path: string,
    runId: string,
    carried: Iterable<LoggedAttempt> = [],
    continuesRun?: string,
    checkpoints: Iterable<string> = [],
    collection?: CollectionIdentity,
  ): Promise<DispatchLog> {
    const log = new DispatchLog(path, runId, continuesRun, [...checkpoints], collection);
    await log.replace(carried);
    return log;
  }

  /**
   * Rewrites this run's log as its header, the carried checkpoint ids and `carried`, in one step: the old log stays until the
   * new one is whole, so a crash meanwhile leaves one or the other, never a part (a crash mid-append
   * of many lines keeps some). Only while nothing is appended: start-up, before any `/run`.
   */
  async replace(carried: Iterable<LoggedAttempt>): Promise<void> {
    const c = this.collection;
    const header = HeaderSchema.parse({
      run_id: this.runId,
      ...(this.continuesRun !== undefined && { continues_run: this.continuesRun }),
      ...(c && collectionFields(c)),
    });
    const lines = [
      JSON.stringify(header),
      ...this.carriedCheckpoints.map((id) => JSON.stringify(CheckpointLineSchema.parse({ checkpoint_id: id }))),
      ...[...carried].map((e) => JSON.stringify(EntrySchema.parse(e))),
    ];
    // Atomic: a crash mid-rewrite must not lose the carried attempts (they would be re-sent as
    // attempt 0, reusing capture keys); the old log stays until the new one is whole.
    await replaceFileDurably(this.path, `${lines.join("\n")}\n`);
    this.cutTo = undefined; // a new file: nothing of the old one to cut
  }

  /** The attempt about to be sent; on disk when this returns. */
  async record(episode: EpisodeId): Promise<void> {
    await this.append(`${JSON.stringify({ rollout_id: episode.rollout_id, attempt: episode.attempt })}\n`);
  }

  /** A checkpoint this run is about to prepare; on disk when this returns, so the next run knows it for its own. */
  async recordCheckpoint(checkpointId: string): Promise<void> {
    await this.append(`${JSON.stringify(CheckpointLineSchema.parse({ checkpoint_id: checkpointId }))}\n`);
  }

  /** The next attempts a restore installed: a later checkpoint continues them before they are sent. */
  async recordRestored(episodes: EpisodeId[]): Promise<void> {
    if (!episodes.length) return;
    await this.append(episodes.map((e) => `${JSON.stringify({ rollout_id: e.rollout_id, attempt: e.attempt, restored: true })}\n`).join(""));
  }

  /** Resolves once `text` is written and synced, with whatever else was queued beside it. */
  private append(text: string): Promise<void> {
    const appended = new Promise<void>((resolve, reject) => this.queued.push({ text, resolve, reject }));
    if (!this.writing) void this.writeQueued();
    return appended;
  }

  /**
   * Group commit: one write and one fdatasync for every append queued before it began. One at a
   * time, so lines keep their order and a long write (over one 512 KiB chunk) is never interleaved.
   */
  private async writeQueued(): Promise<void> {
    this.writing = true;
    while (this.queued.length) {
      const group = this.queued.splice(0);
      try {
        const handle = await open(this.path, "a");
        try {
          if (this.cutTo !== undefined) {
            await handle.truncate(this.cutTo);
            this.cutTo = undefined;
          }
          // A failed append (a full disk after its first chunk, a failed sync) is cut back to the
          // last good length: the next append would land after its fragment, mid-file, where the
          // next start's read refuses it (only a torn last line is ignored).
          const goodLength = (await handle.stat()).size;
          try {
            await handle.appendFile(group.map((a) => a.text).join(""));
            await handle.datasync();
          } catch (error) {
            await handle.truncate(goodLength).catch(() => (this.cutTo = goodLength));
            throw error;
          }
        } finally {
          await handle.close();
        }
        for (const a of group) a.resolve();
      } catch (error) {
        namePath(error, this.path); // a failed write or fdatasync names no path
        for (const a of group) a.reject(error);
      }
    }
    this.writing = false;
  }

  /**
   * Reads a previous run's log, streamed line by line; a torn (unparseable) last line is ignored,
   * any other bad line is an error.
   */
  static async read(path: string): Promise<DispatchHistory | undefined> {
    let opened: Awaited<ReturnType<typeof openRegularFile>>;
    try {
      opened = await openRegularFile(path, { maxBytes: NO_SIZE_LIMIT });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw error;
    }
    let header: z.output<typeof HeaderSchema> | undefined;
    const latest = new Map<string, number>();
    const restoredOnly = new Set<string>();
    const checkpoints = new Set<string>();
    let number = 0;
    const take = (line: string) => {
      number++;
      if (number === 1) {
        header = parseStateValue(HeaderSchema, line, `${path}:1`);
        return;
      }
      if (!line.trim()) return;
      if (CHECKPOINT_LINE.test(line)) {
        checkpoints.add(parseStateValue(CheckpointLineSchema, line, `${path}:${number}`).checkpoint_id);
        return;
      }
      const entry = parseStateValue(EntrySchema, line, `${path}:${number}`);
      const previous = latest.get(entry.rollout_id);
      if (previous !== undefined && entry.attempt < previous) return;
      if (previous === undefined || entry.attempt > previous) {
        latest.set(entry.rollout_id, entry.attempt);
        if (entry.restored) restoredOnly.add(entry.rollout_id);
        else restoredOnly.delete(entry.rollout_id);
      } else if (!entry.restored) {
        restoredOnly.delete(entry.rollout_id); // the restored attempt was sent
      }
    };
    const { handle } = opened;
    try {
      // What follows the last newline at the end is either nothing or a torn append: never taken.
      const splitter = new LineSplitter();
      // A line longer than any valid one is not held: it is refused once its newline comes, and
      // dropped as the torn tail if none does.
      let overlong = false;
      const chunk = Buffer.allocUnsafe(READ_CHUNK);
      for (;;) {
        const { bytesRead } = await handle.read(chunk, 0, chunk.length, null);
        if (bytesRead === 0) break;
        for (const line of splitter.push(chunk.subarray(0, bytesRead))) {
          if (overlong) throw new CheckpointError("invalid_checkpoint_state", `${path}:${number + 1}: not a logged attempt (over ${MAX_LINE_BYTES} bytes)`);
          take(line.bytes.toString("utf8", 0, line.bytes.length - 1));
        }
        if (splitter.pendingBytes > MAX_LINE_BYTES) {
          overlong = true;
          splitter.discardPending();
        }
      }
    } finally {
      await handle.close();
    }
    if (!header) return undefined;
    // Named by its --out: a header without one is older than the collection's name.
    const collection = header.out === undefined ? undefined : fromCollectionFields({ tasks: header.tasks, out: header.out, rollout_id_prefix: header.rollout_id_prefix });
    return { runId: header.run_id, ...(header.continues_run !== undefined && { continuesRun: header.continues_run }), ...(collection && { collection }), latest, restoredOnly, checkpoints };
  }
}
