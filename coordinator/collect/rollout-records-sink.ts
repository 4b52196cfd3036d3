import { readdir } from "node:fs/promises";
import { basename, join, resolve } from "node:path";
import type { Logger } from "pino";
import {
  CheckpointError,
  MAX_ROLLOUT_BATCH_BYTES,
  MAX_ROLLOUT_STEP_MARKER_BYTES,
  ROLLOUTS_DIR,
  assertRolloutEnv,
  encodeRolloutRecords,
  encodeRolloutStepMarker,
  isStorageFailure,
  makeDirectories,
  parentsOfCreated,
  parseRolloutRecordFileName,
  rolloutBatchFit,
  rolloutStepDir,
  rolloutStepMarkerFiles,
  rolloutStepMarkerName,
  stepMarkerComplete,
  timerDelay,
  type RecordKind,
  type TraceRecord,
} from "../../protocol/index.js";
import { fsyncDirectory, linkStagedFile, replaceFileDurably, stageFile } from "../publication/durable-fs.js";
import { readRegularFile } from "../publication/regular-file.js";

export interface RolloutRecordsOptions {
  /** Records go to `<dir>/rollouts/step_<N>/<kind>_rollouts_<env>.jsonl` (+ index, step marker). */
  dir: string;
  env: string;
  kind: RecordKind;
  /** Flush a step file once this many finished rows are buffered. */
  everyRows: number;
  /** …or this many seconds after the first buffered row, whichever comes first. */
  everySeconds: number;
  /** Every reader's step-marker limit; smaller only in tests. */
  maxMarkerBytes?: number;
  /** One step file's or its index's limit (one Buffer); smaller only in tests. */
  maxBatchBytes?: number;
}

export interface RolloutRecordsStats {
  steps: number;
  records: number;
  /** Finished rows whose `/run` reply carried no usable trajectory, or whose record cannot be encoded. */
  skipped: number;
  failedFlushes: number;
  /** Records still buffered after close (every flush of them failed) or added after it: the rows are in results.jsonl only. */
  unwritten: number;
}

const STEP_DIR = /^step_(0|[1-9][0-9]*)$/;

/** Read-merge-write rounds of a step marker before giving up (the step is tried again later). */
const MARKER_ROUNDS = 5;

/**
 * The files an existing marker lists; null when there is none, or it is not a valid marker of this
 * step and kind: rewritten then, since followers ignore it.
 */
async function markerFiles(path: string, step: number, kind: RecordKind): Promise<string[] | null> {
  let text: string;
  try {
    text = await readRegularFile(path, { maxBytes: MAX_ROLLOUT_STEP_MARKER_BYTES });
  } catch {
    return null;
  }
  try {
    return rolloutStepMarkerFiles(JSON.parse(text), step, kind);
  } catch {
    return null;
  }
}

/** A step marker that kept losing entries to concurrent writers (see completeMarker): tried again later. */
class MarkerContention extends Error {}

/** Flushes close tries (a failed step is never reused, so a retry writes the next step) and the pause between them. */
const CLOSE_TRIES = 3;
const CLOSE_RETRY_MS = 500;

/**
 * Buffers finished rows' rollout records and publishes them as step files (step = a counter of
 * flushes, continuing after the highest step already in the directory): the record file (linked
 * into place, never replacing one), then its index, then the step-complete marker (merged with what
 * other writers listed), each atomic and durable. Flushes run one at a time, off the dispatch path.
 */
export class RolloutRecordsSink {
  private buffer: TraceRecord[] = [];
  private nextStep = 1;
  private tail: Promise<void> = Promise.resolve();
  /** Steps whose record file was published but whose marker a failed flush did not write. */
  private readonly unmarked = new Set<number>();
  private timer: NodeJS.Timeout | undefined;
  /** close() runs: it tries again itself, no timer. */
  private closing = false;
  /** close() has finished: no flush comes any more. */
  private closed = false;
  /** Records added after close: never written, always counted in `stats.unwritten`. */
  private late = 0;
  /** Records added and not yet published, dropped or left out (buffered, or in a flush under way before its record file's link): what abandon() counts unwritten. */
  private outstanding = 0;
  /** Set by abandon(): the exit went on without the final flush, so nothing is published or written any more. */
  private abandoned = false;
  readonly stats: RolloutRecordsStats = { steps: 0, records: 0, skipped: 0, failedFlushes: 0, unwritten: 0 };

  constructor(
    private readonly options: RolloutRecordsOptions,
    private readonly logger: Logger,
    /**
     * Runs before a step's record file is published (the collector syncs `--out`, which holds its
     * rows); failing, the step is not written. Answers the records that may be published: after a
     * failed sync, the rows cut from `--out` run again, and their records are left out (dropped).
     */
    private readonly beforePublish?: (records: TraceRecord[]) => Promise<TraceRecord[]>,
  ) {
    assertRolloutEnv(options.env);
  }

  private get root(): string {
    return join(this.options.dir, ROLLOUTS_DIR);
  }

  /**
   * Continues after the highest existing step so a restarted collection never replaces a published
   * step, and completes the markers of steps a killed flush (or a concurrent writer's lost marker
   * update) left listing fewer record files of this kind than the step holds.
   */
  async start(): Promise<void> {
    try {
      // A new directory's entry is in its parent: unsynced, rollouts/ (every record file under it,
      // each durable in its own directory) could vanish in a power loss.
      for (const parent of parentsOfCreated(this.root, await makeDirectories(this.root))) await fsyncDirectory(parent);
      let highest = 0;
      for (const entry of await readdir(this.root, { withFileTypes: true })) {
        const m = STEP_DIR.exec(entry.name);
        if (!m) continue;
        highest = Math.max(highest, Number(m[1]));
        if (entry.isDirectory()) await this.completeMarkerAtStart(Number(m[1]));
      }
      this.nextStep = highest + 1;
    } catch (error) {
      throw this.startRefusal(error);
    }
  }

  /** A marker still losing to concurrent writers is no reason to refuse the start: tried again at the next flush, as after a failed one. */
  private async completeMarkerAtStart(step: number): Promise<void> {
    try {
      await this.completeMarker(step, "start");
    } catch (error) {
      if (!(error instanceof MarkerContention)) throw error;
      this.unmarked.add(step);
      this.logger.warn({ err: error, step }, "completing a rollout step's marker failed; tried again at the next flush");
    }
  }

  /**
   * A start's failure as a catalog refusal: the storage refusing (EIO, EACCES, ENOSPC) stays what it
   * is (storage_error); any other file-system error (a regular file named `rollouts`, a directory
   * where a step's marker goes) is the records dir's content, `invalid_request`, not a bug.
   */
  private startRefusal(error: unknown): unknown {
    if (error instanceof CheckpointError || isStorageFailure(error)) return error;
    const { code, syscall } = (error ?? {}) as NodeJS.ErrnoException;
    if (typeof code !== "string" || typeof syscall !== "string") return error;
    return new CheckpointError("invalid_request", `--records-dir ${this.options.dir}: ${(error as Error).message}`, { cause: error });
  }

  /**
   * Makes the step's marker of this kind list every record file of that kind in the step directory,
   * keeping what it listed already. Step directories are shared: other collections writing into the
   * same `--records-dir` (other envs, or the other kind) publish into the same step and merge the
   * same marker, like `writeStepRecords` does, those that publish before its marker of their kind is
   * written (a marked step takes no new file of that kind: see stepRefuses). Merging is a read-modify-write, so another writer can
   * replace the marker with a list computed before this file appeared: it is read again after each
   * write until it lists everything (whoever writes last checks last). A record file present is whole
   * (published atomically); a missing index only makes readers parse it in full. A marker left short
   * after a few rounds is an error: the step stays in `unmarked` and is tried again.
   */
  private async completeMarker(step: number, why: "start" | "flush" | "retry"): Promise<void> {
    const { kind } = this.options;
    const stepDir = join(this.root, rolloutStepDir(step));
    const markerPath = join(stepDir, rolloutStepMarkerName(kind));
    for (let round = 0; round < MARKER_ROUNDS; round++) {
      const { listed, files } = await this.markerListing(step);
      if (!files.length || stepMarkerComplete(listed, files)) return;
      await replaceFileDurably(markerPath, encodeRolloutStepMarker(step, kind, files, this.maxMarkerBytes));
      if (why !== "flush") this.logger.info({ step, files }, "completed a rollout step marker that did not list every record file");
    }
    throw new MarkerContention(`the ${rolloutStepMarkerName(kind)} of step ${step} kept losing files to concurrent writers`);
  }

  private get maxMarkerBytes(): number {
    return this.options.maxMarkerBytes ?? MAX_ROLLOUT_STEP_MARKER_BYTES;
  }

  private get maxBatchBytes(): number {
    return this.options.maxBatchBytes ?? MAX_ROLLOUT_BATCH_BYTES;
  }

  /** What the step's marker of this kind would list with `extra` added: what it lists and the record files there. */
  private async markerListing(step: number, extra?: string): Promise<{ listed: string[] | null; files: string[] }> {
    const { kind } = this.options;
    const stepDir = join(this.root, rolloutStepDir(step));
    const listed = await markerFiles(join(stepDir, rolloutStepMarkerName(kind)), step, kind);
    let onDisk: string[] = [];
    try {
      onDisk = (await readdir(stepDir)).filter((name) => parseRolloutRecordFileName(name)?.kind === kind);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
    }
    return { listed, files: [...new Set([...(listed ?? []), ...onDisk, ...(extra ? [extra] : [])])].sort() };
  }

  /**
   * Why the step cannot take this file, or null when it can. Not once its marker of this kind is
   * written without the file: a follower may have consumed the step, and would take the file after it
   * (and after any later step it consumed) where a cold loader sorts it in, numbering the tasks
   * differently; `writeStepRecords` refuses so too. Nor when the marker cannot list it too: one no
   * reader accepts would leave the step incomplete for followers. Alone in its marker it always fits
   * (one name); refused otherwise.
   */
  private async stepRefuses(step: number, file: string): Promise<string | null> {
    const { listed, files } = await this.markerListing(step, file);
    if (listed !== null && !listed.includes(file)) return "this step's marker is written (a follower may have consumed the step)";
    try {
      encodeRolloutStepMarker(step, this.options.kind, files, this.maxMarkerBytes);
      return null;
    } catch (error) {
      if (files.length === 1) throw error;
      return "this step's marker cannot list another file";
    }
  }

  add(record: TraceRecord): void {
    if (this.closed) {
      this.late++;
      this.stats.unwritten++;
      return;
    }
    this.buffer.push(record);
    this.outstanding++;
    if (this.buffer.length >= this.options.everyRows) {
      void this.flush();
    } else {
      this.arm();
    }
  }

  /** The timer flush of what is buffered, unless one is already due. */
  private arm(): void {
    if (this.timer || this.closing) return;
    this.timer = setTimeout(() => void this.flush(), timerDelay(this.options.everySeconds * 1000));
    this.timer.unref();
  }

  skip(): void {
    this.stats.skipped++;
  }

  /**
   * Publishes what is buffered now as the next step (the batch is taken at once, so rows finishing
   * meanwhile go to a later step); failures are logged and the records kept for the next flush.
   */
  flush(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const records = this.buffer;
    this.buffer = [];
    if (records.length > 0) this.tail = this.tail.then(() => this.write(records));
    return this.tail;
  }

  /**
   * The final flush, tried again when it fails: there is no later flush to take its rows. What no
   * try wrote is counted in `stats.unwritten`.
   */
  async close(): Promise<void> {
    // Abandoned: its caller exited without it; waiting for the flush that hung again would hold a second exit path as long.
    if (this.abandoned) return;
    this.closing = true;
    await this.flush();
    // Not tried again once abandoned: each try syncs --out first, and the lock is let go by then.
    for (let tries = 1; this.buffer.length > 0 && tries < CLOSE_TRIES && !this.abandoned; tries++) {
      await new Promise((resolve) => setTimeout(resolve, CLOSE_RETRY_MS));
      await this.flush();
    }
    // Abandoned: its caller exited (the lock let go) and counted what was not written.
    if (this.abandoned) return;
    await this.markUnmarked();
    this.stats.unwritten = this.buffer.length + this.late;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.closed = true;
  }

  /**
   * close() was not waited for (its storage hangs, and the process exits): every record not yet
   * written, buffered or in the flush under way, is counted in `stats.unwritten` now, and a record
   * added from now on too. A flush whose sync ends after it publishes nothing: the exit went on, the
   * lock let go, and another collection may write the directory by then; nor is any flush started
   * after it (a retry of close, a batch's next step), and a later close() returns at once.
   */
  abandon(): void {
    if (this.closed) return;
    this.abandoned = true;
    this.stats.unwritten = this.outstanding + this.late;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.closing = true;
    this.closed = true;
  }

  /**
   * Writes a flushed batch as one step, or as several in a row when one step file cannot hold it all
   * (its record file or index past one Buffer): refused so now, it would be refused so by every later
   * flush, all its rows kept back for ever.
   */
  private async write(batch: TraceRecord[]): Promise<void> {
    let rest = batch;
    // Abandoned: nothing more is synced, marked or published (a step queued behind the hung one, the next part of a split batch).
    while (rest.length > 0 && !this.abandoned) rest = await this.writeStep(rest);
  }

  /**
   * Writes as many leading records of `batch` as one step file holds, and returns the others for the
   * next step; none when the flush failed before publishing (they are all back in the buffer then).
   */
  private async writeStep(batch: TraceRecord[]): Promise<TraceRecord[]> {
    let records = batch;
    let rest: TraceRecord[] = [];
    // A step number is never reused, even after a failed (possibly half-visible) attempt.
    let step = this.nextStep++;
    await this.markUnmarked();
    let published = false;
    let recordFile: string | undefined;
    try {
      // Records first, then the index that points into them, then the marker listing the file. The
      // record file is linked into place, never renamed over: another collection with this env and
      // kind writing into the same directory may hold this step already, and then the next is tried.
      let encoded: ReturnType<typeof encodeRolloutRecords>;
      if (this.beforePublish) {
        const kept = await this.beforePublish(records);
        if (kept.length < records.length) this.logger.warn({ step, dropped: records.length - kept.length }, "rollout records of rows cut from --out are dropped: those rows run again");
        this.outstanding -= records.length - kept.length;
        records = kept;
        // The sync before it ended only after the exit went on without it: another collection may own the directory now.
        if (!records.length || this.abandoned) return [];
      }
      for (;;) {
        const next = this.encode(step, records);
        rest = [...next.rest, ...rest];
        if (!next.encoded) {
          // Every record of this step was left out: the rest of the batch, if any, takes the step.
          if (!rest.length) return [];
          [records, rest] = [rest, []];
          continue;
        }
        records = next.records;
        encoded = next.encoded;
        // Other collections marked this step, or filled its marker: the next step takes the file instead.
        const refused = await this.stepRefuses(step, basename(encoded.recordFile));
        if (refused) {
          this.logger.info({ step, file: encoded.recordFile }, `${refused}; trying the next step`);
          step = this.nextStep++;
          continue;
        }
        const stepDir = join(this.root, rolloutStepDir(step));
        // The root always (the step directory may be another collection's, not yet synced), and
        // whatever above it had to be made again (rollouts/ removed since the start).
        const parents = new Set([resolve(this.root), ...parentsOfCreated(stepDir, await makeDirectories(stepDir))]);
        for (const parent of parents) await fsyncDirectory(parent);
        if (await linkStagedFile(await stageFile(join(this.root, encoded.recordFile), encoded.recordBytes))) break;
        this.logger.info({ step, file: encoded.recordFile }, "another collection published this step's file; trying the next step");
        step = this.nextStep++;
      }
      recordFile = encoded.recordFile;
      published = true;
      // Linked: its records are out for readers whatever follows (never taken back), so not
      // counted unwritten by an abandon while the index or marker after it hangs.
      this.outstanding -= records.length;
      await fsyncDirectory(join(this.root, rolloutStepDir(step)));
      await replaceFileDurably(join(this.root, encoded.indexFile), encoded.indexBytes);
      await this.completeMarker(step, "flush");
      this.written(step, records.length, encoded.recordFile);
      return rest;
    } catch (error) {
      this.stats.failedFlushes++;
      if (published) {
        // A published record file is never taken back: a follower that does not wait for markers
        // may have loaded it already, and would see its rows again in a later step. Its rows are
        // written; the marker is written by the next flush (or close, or the next start), and a
        // missing index only makes readers parse the file in full.
        this.unmarked.add(step);
        this.written(step, records.length, recordFile!);
        this.logger.warn({ err: error, step }, "rollout records written, but their index or marker failed; the marker is tried again");
        return rest;
      }
      // Nothing of it was published: its rows, and the rest of the batch, go into a later step.
      this.buffer = [...records, ...rest, ...this.buffer];
      // No row may come to start the timer again (the last rows finished): start it now.
      this.arm();
      this.logger.warn({ err: error, step, records: records.length + rest.length }, "writing rollout records failed; kept for the next flush");
      return [];
    }
  }

  /**
   * Encodes the step, dropping the records that cannot be encoded (a line longer than any reader can
   * decode, a value JSON cannot encode): refused so now, they are refused so by every later flush, and
   * kept back they would hold back every record after them. Counted as skipped, as a reply without a
   * usable trajectory is. A batch whose record file or index would pass one Buffer is split where the
   * protocol says it fits: `rest`, the records after that, go into the next step.
   */
  private encode(step: number, batch: TraceRecord[]): { encoded?: ReturnType<typeof encodeRolloutRecords>; records: TraceRecord[]; rest: TraceRecord[] } {
    const { kind, env } = this.options;
    let records = batch;
    let rest: TraceRecord[] = [];
    for (;;) {
      try {
        return { encoded: encodeRolloutRecords({ kind, env, step, records }, this.maxBatchBytes), records, rest };
      } catch (error) {
        if (!(error instanceof CheckpointError && error.code === "invalid_request")) throw error;
        const fitting = rolloutBatchFit(error);
        if (fitting !== undefined && records.length > 1) {
          // At least one record: one that does not fit alone is left out below, at the next try.
          const cut = Math.max(fitting, 1);
          this.logger.info({ step, records: cut, rest: records.length - cut + rest.length }, "a step file cannot hold every buffered record; the rest go into the next step");
          rest = [...records.slice(cut), ...rest];
          records = records.slice(0, cut);
          continue;
        }
        const usable = records.filter((record) => {
          try {
            encodeRolloutRecords({ kind, env, step, records: [record] }, this.maxBatchBytes);
            return true;
          } catch (refusal) {
            this.stats.skipped++;
            this.outstanding--;
            this.logger.warn({ err: refusal, id: record.id }, "a rollout record cannot be encoded; it is left out");
            return false;
          }
        });
        // Nothing left out: the batch as a whole is refused (not one record); thrown as a failed flush.
        if (usable.length === records.length) throw error;
        if (!usable.length) return { records: usable, rest };
        records = usable;
      }
    }
  }

  private written(step: number, records: number, file: string): void {
    this.stats.steps++;
    this.stats.records += records;
    this.logger.info({ step, records, file }, "rollout records written");
  }

  /** Writes the markers a failed flush left out (steps whose record file was published). */
  private async markUnmarked(): Promise<void> {
    for (const step of [...this.unmarked]) {
      try {
        await this.completeMarker(step, "retry");
        this.unmarked.delete(step);
      } catch (error) {
        this.logger.warn({ err: error, step }, "writing a rollout step's marker failed; tried again at the next flush and the next start");
      }
    }
  }
}
