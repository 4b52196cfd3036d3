import { randomBytes } from "node:crypto";
import { closeSync, constants, fdatasync, fstatSync, ftruncateSync, open as openFd, writeSync } from "node:fs";
import { promisify } from "node:util";
import { open, readdir, unlink, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { CheckpointError, makeDirectories, namePath, parseCaptureKey } from "../../../protocol/index.js";
import { refuseCaseFoldingDir, type CaseProbeFs } from "../../storage/case-folding-dir.js";
import { fsyncDir, writeFileAtomic } from "../../storage/fs-durable.js";
import { isProbeFileName, removeStaleProbeFiles } from "../../storage/stale-probe-files.js";
import { LedgerRowSchema, type LedgerRow } from "./ledger-row.js";
import { StripedLocks } from "./striped-locks.js";

const SUFFIX = ".lineage.jsonl";
/** writeFileAtomic's temp name for a ledger file: `.<key>.lineage.jsonl.<pid>.<12 hex>.tmp`. */
const TEMP_NAME = /^\.(.+)\.lineage\.jsonl\.\d+\.[0-9a-f]{12}\.tmp$/;
const openAsync = promisify(openFd);
const fdatasyncAsync = promisify(fdatasync);
/** Ledger files are opened without following a symlink: one planted in their place is refused (ELOOP). */
const NOFOLLOW = constants.O_NOFOLLOW ?? 0;
const APPEND_FLAGS = constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | NOFOLLOW;

/**
 * The largest ledger file read (one capture key's rows): 256 MiB, some 700 000 rows of about 380 bytes (ids, route, staging key, usage),
 * far past the 100 000 rows a model record holds. A larger file (damage, or a file put there) is
 * refused with `payload_too_large` before a byte of it is read, not read whole into memory (past
 * 2 GiB Node's own RangeError, internal_error). Smaller only in tests (`maxFileBytes`).
 */
export const MAX_LEDGER_FILE_BYTES = 256 << 20;

/** What probeWritable writes: one filesystem block. */
const PROBE_BYTES = 4096;

/** Writes bytes at the descriptor's position (append); returns how many were written. A seam for tests. */
export type LedgerWrite = (fd: number, buffer: Buffer, offset: number) => number;
/** Makes what was written through the descriptor durable (fdatasync, in the thread pool). A seam for tests. */
export type LedgerSync = (fd: number) => Promise<void>;

export interface CaptureLedgerOptions {
  write?: LedgerWrite;
  sync?: LedgerSync;
  /** How many rows the in-memory copy keeps at most (an empty ledger counts as one); default 50 000. */
  maxCachedRows?: number;
  /** The largest ledger file read; default MAX_LEDGER_FILE_BYTES. A seam for tests. */
  maxFileBytes?: number;
  /** Told once per load of a ledger file with unreadable lines (1-based line numbers). */
  onCorrupt?: (path: string, lines: number[]) => void;
  /** Told when a stripe's lock file could not be removed (it stays held and is released again later). */
  onLockReleaseFailed?: (lockFile: string, error: unknown) => void;
  /** The filesystem the open's case probe asks (see refuseCaseFoldingDir). A seam for tests. */
  caseProbe?: CaseProbeFs;
}

/**
 * The capture ledger: per capture key, an append-only JSONL file of lineage rows
 * (`<dir>/<capture_key>.lineage.jsonl`), guarded by a bounded set of striped lock files
 * (`<dir>/locks/stripe-NNNN.lock`). Reads go through an in-memory copy of recently used keys, so
 * resolving a call's parent does not touch the disk on the hot path. The copy is bounded
 * (`maxCachedRows`, least recently used keys dropped first): a finished rollout's rows leave memory as
 * new rollouts come, and a dropped key is read again from its file when used. Appends reuse an open
 * descriptor per key (at most `maxHandles`, least recently used closed first) and write
 * synchronously: a few-hundred-byte page-cache append costs ~3 µs inline, against ~20 µs of CPU
 * and a thread-pool round trip for an asynchronous write (and an open/close per row before); its
 * fdatasync (below) runs in the thread pool, outside the stripe lock.
 * Creating a file stays asynchronous (it costs far more). Which keys have a file is listed once at
 * start-up and kept current, so a new rollout's first call never probes the disk: the directory
 * belongs to one model server process at a time. Ledger files are opened without following symlinks
 * and rewritten through exclusively created temp files with unguessable names, so a symlink planted in
 * the directory is refused rather than written through.
 *
 * An append resolves only once its line is durable (fdatasync, and a new file's directory entry
 * fsynced): the caller's response ends after it, and a caller holding a complete answer must find
 * its row in the ledger a restarted process reads, also after a power loss or kernel crash. The sync
 * runs in the thread pool outside the stripe lock, one per descriptor at a time: appends arriving
 * while one runs share the next, so concurrent calls of one key cost one fdatasync. A sync that
 * fails takes the row back (the append rejects: the caller's call fails as a whole).
 *
 * A row enters memory only once its whole line is in the file. A write that fails part way (a full
 * disk, an I/O error) is cut off again (truncated back to the size before it) so nothing is glued to
 * it; if even that fails, the key is truncated before its next append. A line in the middle that is
 * not a row (damage from outside) does not make the key unusable: its rows load, new calls append,
 * and the key reports its unreadable lines (`load`), which export refuses to paper over.
 */
export class CaptureLedger {
  readonly locks: StripedLocks;
  /** Loaded keys in LRU order (oldest first). */
  private readonly cache = new Map<string, LedgerEntry>();
  /** Rows held by `cache` (an empty ledger counts as one). */
  private cachedWeight = 0;
  private readonly maxCachedRows: number;
  /** Open append descriptors in LRU order. Writes are synchronous, so closing one never races a write. */
  private readonly handles = new Map<string, number>();
  /** Keys with a ledger file, listed at start-up and kept current. */
  private readonly onDisk = new Set<string>();
  /** Keys on disk or in memory, by rollout id: retire, restore and forget find a rollout's keys without listing the directory. */
  private readonly byRollout = new Map<string, Set<string>>();
  /** Keys whose failed write could not be cut off: the file is truncated to this size before the next append. */
  private readonly repair = new Map<string, number>();
  private readonly write: LedgerWrite;
  private readonly sync: LedgerSync;
  /** Per descriptor: the fdatasync running, and the one queued behind it (shared by every append meanwhile). */
  private readonly syncs = new Map<number, SyncSlot>();
  /** Descriptors closed while a sync of theirs ran: closed once it settled (the number stays ours till then). */
  private readonly closeAfterSync = new Set<number>();
  /** Keys whose file an append created and whose directory entry is not known durable yet. */
  private readonly newEntries = new Set<string>();
  private readonly dirSyncs = new Map<"dir", SyncSlot>();
  /** Unlinks of ledger files done, and how many of the first of them a directory fsync that ended covered. */
  private unlinks = 0;
  private unlinksSynced = 0;
  /** Appends whose line is written and not yet durable: close() waits for them. */
  private readonly syncing = new Set<Promise<unknown>>();
  private readonly ready: Promise<void>;

  constructor(
    readonly dir: string,
    stripes = 16,
    private readonly maxHandles = 256,
    private readonly options: CaptureLedgerOptions = {},
  ) {
    this.write = options.write ?? ((fd, buffer, offset) => writeSync(fd, buffer, offset));
    this.sync = options.sync ?? ((fd) => fdatasyncAsync(fd));
    this.maxCachedRows = options.maxCachedRows ?? 50_000;
    this.locks = new StripedLocks(join(dir, "locks"), stripes, undefined, undefined, options.onLockReleaseFailed);
    this.ready = makeDirectories(dir, { mode: 0o700 }).then(async () => {
      // One file per capture key: keys differing only in case must not share one.
      await refuseCaseFoldingDir(dir, "capture ledger directory", options.caseProbe);
      const { keys, temps, probes } = await this.listDir();
      for (const key of keys) this.addOnDisk(key);
      // What a crash left between a probe's create and remove (this process's probes are younger).
      await removeStaleProbeFiles(dir, probes);
      // Not awaited: the sweep takes stripe locks, which work already queued on them may hold while
      // it waits for this listing. close() lets it finish (the locks' accepted work).
      this.sweepTemps(temps);
    });
    this.ready.catch(() => undefined); // a directory that cannot be made is every use's error, not the process's
  }

  fileOf(key: string): string {
    // Keys already known here were validated when they were first seen.
    if (!this.cache.has(key) && !this.onDisk.has(key) && !parseCaptureKey(key)) throw new Error(`not a capture key: ${key}`);
    return join(this.dir, `${key}${SUFFIX}`);
  }

  /** The rows of a capture key, from memory or its file. */
  async rows(key: string): Promise<readonly LedgerRow[]> {
    return (await this.load(key)).rows;
  }

  /** A capture key's rows and the 1-based numbers of its file's lines that are not rows. */
  async load(key: string): Promise<Readonly<LedgerEntry>> {
    const cached = this.cache.get(key);
    if (cached) {
      this.cache.delete(key);
      this.cache.set(key, cached);
      return cached;
    }
    return this.locks.run(key, async () => {
      await this.ready;
      const again = this.cache.get(key);
      if (again) return again;
      const loaded = this.onDisk.has(key) ? await this.readFile(key) : { rows: [], corrupt: [] };
      if (loaded.corrupt.length) this.options.onCorrupt?.(this.fileOf(key), loaded.corrupt);
      this.cachePut(key, loaded);
      return loaded;
    });
  }

  /** How much the in-memory copy holds (for tests and status). */
  cacheSize(): { keys: number; rows: number } {
    let rows = 0;
    for (const entry of this.cache.values()) rows += entry.rows.length;
    return { keys: this.cache.size, rows };
  }

  private cachePut(key: string, entry: LedgerEntry): void {
    this.cacheDrop(key);
    this.cache.set(key, entry);
    this.index(key);
    this.cachedWeight += weightOf(entry);
    this.trimCache();
  }

  private cacheDrop(key: string): void {
    const entry = this.cache.get(key);
    if (!entry) return;
    this.cache.delete(key);
    this.cachedWeight -= weightOf(entry);
    this.unindex(key);
  }

  private addOnDisk(key: string): void {
    this.onDisk.add(key);
    this.index(key);
  }

  private index(key: string): void {
    const rolloutId = parseCaptureKey(key)?.rollout_id;
    if (rolloutId === undefined) return;
    const keys = this.byRollout.get(rolloutId);
    if (keys) keys.add(key);
    else this.byRollout.set(rolloutId, new Set([key]));
  }

  /** Forgets a key that is neither on disk nor in memory any more. */
  private unindex(key: string): void {
    if (this.onDisk.has(key) || this.cache.has(key)) return;
    const rolloutId = parseCaptureKey(key)?.rollout_id;
    const keys = rolloutId === undefined ? undefined : this.byRollout.get(rolloutId);
    if (!keys) return;
    keys.delete(key);
    if (keys.size === 0) this.byRollout.delete(rolloutId!);
  }

  /** Drops the least recently used keys past the bound (never the most recent one). */
  private trimCache(): void {
    while (this.cachedWeight > this.maxCachedRows && this.cache.size > 1) this.cacheDrop(this.cache.keys().next().value as string);
  }

  /**
   * Appends one row: the whole line goes to the file, then the row to the in-memory copy (when the
   * key is loaded), then the line is made durable, so a following call sees it as soon as the
   * promise resolves and a restart (after a power loss too) finds it. On a failed write or sync the
   * promise rejects and neither the file nor memory keeps any of it (unless taking back a row whose
   * sync failed fails too: then it stays, as a row an undelivered call could not take back).
   */
  async append(row: LedgerRow): Promise<void> {
    const parsed = LedgerRowSchema.parse(row);
    const key = parsed.capture_key;
    const line = Buffer.from(`${JSON.stringify(parsed)}\n`);
    // The key's file is open (so the ledger is ready) and its stripe ours and free: written now. The
    // row ends a call's response, which waits for it: each turn of the locked path would add latency.
    // Either way its sync starts under the stripe lock, before a rewrite or removal could close the
    // descriptor (a close waits for the sync running on it).
    const open = this.handles.get(key);
    let durable: Promise<void> | undefined;
    const writtenNow =
      open !== undefined &&
      this.locks.runNowIfFree(key, () => {
        this.writeRow(key, open, parsed, line);
        durable = this.makeDurable(key, open);
      });
    if (!writtenNow) {
      // Taken by the locks at once (before any await), so a close() that follows still lets it finish.
      durable = (
        await this.locks.run(key, async () => {
          await this.ready;
          let fd = this.handles.get(key);
          if (fd === undefined) {
            const existed = this.onDisk.has(key);
            fd = await this.openAppend(key);
            if (!existed) this.newEntries.add(key);
          }
          this.writeRow(key, fd, parsed, line);
          return { durable: this.makeDurable(key, fd) };
        })
      ).durable;
    }
    const settled = durable!.then(
      () => undefined,
      () => undefined,
    );
    this.syncing.add(settled);
    try {
      await durable;
    } catch (error) {
      // Not known on disk: taken back, so neither a restart nor an export finds a row whose call failed.
      await this.retract(key, parsed.model_call_id).catch(() => undefined);
      throw namePath(error, this.fileOf(key)); // a failed fdatasync names no path either
    } finally {
      this.syncing.delete(settled);
    }
  }

  /**
   * Started under the key's stripe lock, right after its line was written: the descriptor's data
   * synced (one sync shared with the appends meanwhile), then, for a file an append created, the
   * directory (one fsync shared the same way).
   */
  private async makeDurable(key: string, fd: number): Promise<void> {
    try {
      await this.coalesced(this.syncs, fd, () => this.sync(fd));
    } finally {
      if (!this.syncs.has(fd) && this.closeAfterSync.delete(fd)) closeQuietly(fd);
    }
    if (!this.newEntries.has(key)) return;
    // Every key marked before this directory sync starts is covered by it.
    const covered = [...this.newEntries];
    await this.coalesced(this.dirSyncs, "dir", () => fsyncDir(this.dir));
    for (const k of covered) this.newEntries.delete(k);
  }

  /**
   * Runs `op` in `slot` so that each caller gets a run that started after it asked: callers arriving
   * while one runs share the one queued behind it.
   */
  private coalesced<K>(slots: Map<K, SyncSlot>, slot: K, op: () => Promise<void>): Promise<void> {
    const start = (): Promise<void> => {
      const state: SyncSlot = { running: new Promise<void>((resolve, reject) => void op().then(resolve, reject)), queued: undefined };
      slots.set(slot, state);
      const settle = () => {
        if (slots.get(slot) === state && state.queued === undefined) slots.delete(slot);
      };
      state.running.then(settle, settle);
      return state.running;
    };
    const current = slots.get(slot);
    if (!current) return start();
    current.queued ??= current.running.then(start, start);
    return current.queued;
  }

  /** Under the key's stripe lock: the line to the file, then the row to memory. */
  private writeRow(key: string, fd: number, row: LedgerRow, line: Buffer): void {
    this.touch(key, fd);
    const cut = this.repair.get(key);
    if (cut !== undefined) {
      ftruncateSync(fd, cut);
      this.repair.delete(key);
    }
    const before = fstatSync(fd).size;
    try {
      for (let written = 0; written < line.length; ) written += this.write(fd, line, written);
    } catch (error) {
      this.cutOff(key, fd, before);
      throw namePath(error, this.fileOf(key)); // a write on a descriptor names no path: the log line should
    }
    if (!this.onDisk.has(key)) this.addOnDisk(key);
    const entry = this.cache.get(key);
    if (entry) {
      if (entry.rows.length > 0) this.cachedWeight += 1;
      entry.rows.push(row);
      this.trimCache();
    }
  }

  /**
   * Whether an append could be made durable now: a block of probe bytes is written (through the same
   * write and sync as a row) to a file of this process's own in the ledger directory, then removed.
   * Rejects with the storage's error (ENOSPC, EIO, EROFS...), naming the probe file. A whole block,
   * not a row's few hundred bytes: a row crossing into a new block needs one free.
   */
  async probeWritable(): Promise<void> {
    await this.ready;
    // A new name each time, created exclusively: nothing planted at a name known in advance (a
    // symlink: ELOOP, which is no storage failure) could keep the outage from ending.
    const path = join(this.dir, `.write-probe.${process.pid}.${randomBytes(6).toString("hex")}`);
    const fd = await openAsync(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | NOFOLLOW, 0o600);
    try {
      const block = Buffer.alloc(PROBE_BYTES, 0x20);
      for (let done = 0; done < block.length; ) done += this.write(fd, block.subarray(done), 0);
      await this.sync(fd);
    } catch (error) {
      throw namePath(error, path);
    } finally {
      closeQuietly(fd);
      await unlink(path).catch(() => undefined);
    }
  }

  /** Under the key's stripe lock: removes what a failed write left after `size` bytes. */
  private cutOff(key: string, fd: number, size: number): void {
    try {
      ftruncateSync(fd, size);
    } catch {
      this.repair.set(key, size);
      this.dropHandle(key);
    }
  }

  /** Lets the writes already asked for finish, then closes every append descriptor and releases the lock files. */
  async close(): Promise<void> {
    await this.ready;
    // The appends whose line is written finish making it durable (or take it back, under the lock)
    // first, and so do those the locks still let finish.
    while (this.syncing.size > 0) await Promise.allSettled([...this.syncing]);
    await this.locks.close();
    while (this.syncing.size > 0) await Promise.allSettled([...this.syncing]);
    for (const fd of this.handles.values()) this.closeHandle(fd);
    this.handles.clear();
  }

  /** Closes an append descriptor, once the sync running on it settled (its number is not reused meanwhile). */
  private closeHandle(fd: number): void {
    if (this.syncs.has(fd)) this.closeAfterSync.add(fd);
    else closeQuietly(fd);
  }

  /** Under the key's stripe lock: marks the descriptor most recently used. */
  private touch(key: string, fd: number): void {
    this.handles.delete(key);
    this.handles.set(key, fd);
    if (this.handles.size <= this.maxHandles) return;
    const [oldest, old] = this.handles.entries().next().value as [string, number];
    this.handles.delete(oldest);
    this.closeHandle(old);
  }

  /** Under the key's stripe lock: opens (creating) the key's file for appends, off the event loop. */
  private async openAppend(key: string): Promise<number> {
    return openAsync(this.fileOf(key), APPEND_FLAGS, 0o600);
  }

  /** Under the key's stripe lock: the file is about to be renamed over or removed. */
  private dropHandle(key: string): void {
    const fd = this.handles.get(key);
    if (fd === undefined) return;
    this.handles.delete(key);
    this.closeHandle(fd);
  }

  /** Replaces a key's ledger with `rows` (atomic rename). */
  async replace(key: string, rows: LedgerRow[]): Promise<void> {
    const checked = rows.map((r) => LedgerRowSchema.parse(r));
    await this.locks.run(key, async () => {
      await this.ready;
      await this.rewrite(key, checked.map((r) => `${JSON.stringify(r)}\n`).join(""));
      this.cachePut(key, { rows: checked, corrupt: [] });
    });
  }

  /**
   * Takes back one call's row (its response never fully left for the caller): the file is rewritten
   * without that line, every other line kept as it is. False when the key has no such row.
   */
  async retract(key: string, modelCallId: string): Promise<boolean> {
    return this.locks.run(key, async () => {
      await this.ready;
      if (!this.onDisk.has(key)) return false;
      let data = await this.readNoFollow(this.fileOf(key));
      // A failed write whose cut-off also failed: its fragment goes, as the next append would cut it.
      const cut = this.repair.get(key);
      if (cut !== undefined) data = data.subarray(0, cut);
      // So is a torn tail (no newline): never a row (readFile), it goes as the next append would cut it.
      data = data.subarray(0, data.lastIndexOf(0x0a) + 1);
      // In bytes: a damaged line (not UTF-8) is written back exactly as it was. Lines are visited, not
      // collected: a file of short lines would otherwise cost an object per line.
      let found: { start: number; end: number } | undefined;
      for (const line of lineSpans(data)) {
        if (parseRow(data.toString("utf8", line.start, line.end))?.model_call_id === modelCallId) found = line;
      }
      if (found === undefined) return false;
      // The line goes with its newline (the last line, which has none, with the one before it).
      const [from, to] = found.end < data.length ? [found.start, found.end + 1] : [Math.max(0, found.start - 1), found.end];
      await this.rewrite(key, Buffer.concat([data.subarray(0, from), data.subarray(to)]));
      // Read again on next use: line numbers of unreadable lines may have moved.
      this.cacheDrop(key);
      return true;
    });
  }

  /**
   * Under the key's stripe lock: replaces the key's file with `text`, atomically and durably (temp
   * file fsynced, renamed, directory fsynced): a crash leaves the old rows or the new ones, never an
   * empty file.
   */
  private async rewrite(key: string, data: string | Buffer): Promise<void> {
    this.dropHandle(key);
    try {
      // Once renamed, the file is `data` (written without a torn tail), even if the directory fsync
      // then fails: a repair offset was the old file's (cutting the new one there would drop rows or
      // pad it with zeros), and a key new on disk is known, or its rows would read as none.
      await writeFileAtomic(this.fileOf(key), data, {
        mode: 0o600,
        onPublished: () => {
          this.repair.delete(key);
          if (!this.onDisk.has(key)) this.addOnDisk(key);
        },
      });
    } catch (error) {
      // Only the directory's fsync may have failed, after the rename: the file may hold the new
      // rows, so memory is read again from it rather than kept as it was.
      this.cacheDrop(key);
      throw error;
    }
  }

  /**
   * Deletes the ledgers of these keys (memory and disk). `unless` is asked under each key's stripe
   * lock, where no append can land between the answer and the unlink: true keeps that key. A key is
   * forgotten only once its file is gone: one whose unlink fails (an I/O error, a read-only mount)
   * stays known with its rows, as its file still holds them, so a retried removal finds it and a
   * later call neither starts an empty lineage nor appends to the old file behind it.
   */
  async remove(keys: Iterable<string>, unless?: (key: string) => boolean, options: { sync?: boolean } = {}): Promise<void> {
    let unlinked = false;
    for (const key of keys) {
      await this.locks.run(key, async () => {
        if (unless?.(key)) return;
        await this.ready;
        const path = this.fileOf(key);
        this.dropHandle(key);
        unlinked = true;
        try {
          await unlink(path).catch((error: NodeJS.ErrnoException) => {
            if (error.code !== "ENOENT") throw error;
          });
        } finally {
          // Counted once done (also when it failed: it may have removed the entry): a directory sync
          // that starts from here on covers it.
          this.unlinks += 1;
        }
        this.cacheDrop(key);
        this.repair.delete(key);
        this.onDisk.delete(key);
        this.unindex(key);
      });
    }
    if (unlinked && options.sync !== false) await this.syncRemovals();
  }

  /**
   * Makes the removals so far durable: one directory fsync (shared as an append's is), once a file
   * was unlinked since the last. A removal resolves only after it (unless the caller syncs a batch
   * itself, `sync: false`): otherwise a power loss brings a freed ledger back and a later call of its
   * key continues rows the protocol freed. After a failed fsync the next call syncs again.
   */
  async syncRemovals(): Promise<void> {
    const upTo = this.unlinks;
    if (this.unlinksSynced >= upTo) return;
    await this.coalesced(this.dirSyncs, "dir", () => fsyncDir(this.dir));
    this.unlinksSynced = Math.max(this.unlinksSynced, upTo);
  }

  /** Capture keys of a rollout that have a ledger here (on disk or in memory), by attempt. */
  async keysOfRollout(rolloutId: string): Promise<{ key: string; attempt: number }[]> {
    await this.ready;
    const out: { key: string; attempt: number }[] = [];
    for (const key of this.byRollout.get(rolloutId) ?? []) {
      const episode = parseCaptureKey(key);
      if (episode && episode.rollout_id === rolloutId) out.push({ key, attempt: episode.attempt });
    }
    return out.sort((a, b) => a.attempt - b.attempt);
  }

  /** Drops the in-memory copy only (forget): the files stay for whoever consumes them. */
  evict(rolloutId: string): void {
    for (const key of [...(this.byRollout.get(rolloutId) ?? [])]) this.cacheDrop(key);
  }

  /** Capture keys with a ledger file in the directory, rewrite temp files by their key, and probe files. */
  private async listDir(): Promise<{ keys: string[]; temps: Map<string, string[]>; probes: string[] }> {
    const keys: string[] = [];
    const temps = new Map<string, string[]>();
    const probes: string[] = [];
    for (const name of await readdir(this.dir)) {
      if (isProbeFileName(name)) probes.push(name);
      const key = name.endsWith(SUFFIX) ? name.slice(0, -SUFFIX.length) : null;
      if (key !== null && parseCaptureKey(key)) keys.push(key);
      const temp = TEMP_NAME.exec(name);
      if (temp && parseCaptureKey(temp[1]!)) temps.set(temp[1]!, [...(temps.get(temp[1]!) ?? []), name]);
    }
    return { keys, temps, probes };
  }

  /**
   * Removes rewrite temp files a crash left between their create and rename. A rewrite runs wholly
   * under its key's stripe lock, owned across processes, so once this process holds that stripe no
   * live writer, here or in a process sharing the directory, is using one: whatever pid its name
   * carries, it is stale. A stripe that cannot be taken now (a live owner past the wait) keeps its
   * temp files for the next open.
   */
  private sweepTemps(temps: Map<string, string[]>): void {
    for (const [key, names] of temps) {
      this.locks
        .run(key, async () => {
          for (const name of names) await unlink(join(this.dir, name)).catch(() => undefined);
        })
        .catch(() => undefined);
    }
  }

  /**
   * A ledger file's bytes, not through a symlink, refused (`payload_too_large`) when it is larger
   * than `maxFileBytes` before any is read; read up to the size found (an append meanwhile is not this
   * read's: appends hold the key's stripe lock, as the callers do).
   */
  private readNoFollow(path: string): Promise<Buffer> {
    const max = this.options.maxFileBytes ?? MAX_LEDGER_FILE_BYTES;
    return withFile(path, constants.O_RDONLY | NOFOLLOW, async (file) => {
      const { size } = await file.stat();
      if (size > max) {
        throw new CheckpointError("payload_too_large", `capture ledger ${path} is ${size} bytes, over the ${max}-byte limit of one key's ledger: retire the episode, or move the file away`);
      }
      const data = Buffer.allocUnsafe(size);
      let got = 0;
      while (got < size) {
        const { bytesRead } = await file.read(data, got, size - got, got);
        if (bytesRead === 0) break;
        got += bytesRead;
      }
      return data.subarray(0, got);
    });
  }

  /** Under the key's stripe lock: the file's rows, and the numbers of its lines that are not rows. */
  private async readFile(key: string): Promise<LedgerEntry> {
    const path = this.fileOf(key);
    let data: Buffer;
    try {
      data = await this.readNoFollow(path);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return { rows: [], corrupt: [] };
      throw error;
    }
    // A failed write whose cut-off also failed: its fragment is no row, even one that lost only its
    // newline (its call failed); the next append truncates it (as retract leaves it out).
    const cut = this.repair.get(key);
    if (cut !== undefined) data = data.subarray(0, cut);
    // Split in bytes, not decoded text: a damaged line that is not UTF-8 decodes to a different length,
    // and the torn tail must be cut at its byte offset.
    const end = data.lastIndexOf(0x0a) + 1;
    const rows: LedgerRow[] = [];
    const corrupt: number[] = [];
    let index = 0;
    for (const line of lineSpans(data.subarray(0, end))) {
      index++;
      if (line.end === end) break; // the empty part after the last newline
      const text = data.toString("utf8", line.start, line.end);
      if (!text.trim()) continue;
      const row = parseRow(text);
      if (row) rows.push(row);
      else corrupt.push(index);
    }
    // What follows the last newline is an append a crash (or a full disk) cut short. It is no row,
    // even a complete one that lost only its newline: an append is acknowledged once its whole line
    // is durable, so that call's response never ended (a failed write whose cut-off failed in an
    // earlier process, a crash before the sync). Kept, it became the re-issued call's parent and a
    // checkpoint exported a call its caller never got. Cut off, so the next append starts a line.
    if (end < data.length) await withFile(path, constants.O_WRONLY | NOFOLLOW, (file) => file.truncate(end));
    return { rows, corrupt };
  }
}

async function withFile<T>(path: string, flags: number, fn: (file: FileHandle) => Promise<T>): Promise<T> {
  const file = await open(path, flags);
  try {
    return await fn(file);
  } finally {
    await file.close();
  }
}

/** The byte spans of `data`'s lines split at each newline (as String.split: n newlines give n + 1 parts), newline excluded. */
function* lineSpans(data: Buffer): Generator<{ start: number; end: number }> {
  let start = 0;
  for (let at = data.indexOf(0x0a); at !== -1; at = data.indexOf(0x0a, start)) {
    yield { start, end: at };
    start = at + 1;
  }
  yield { start, end: data.length };
}

/** A sync running, and the one queued behind it (shared by every caller that asked meanwhile). */
interface SyncSlot {
  running: Promise<void>;
  queued: Promise<void> | undefined;
}

/** A loaded key: its rows, and the 1-based numbers of its file's lines that are not rows. */
export interface LedgerEntry {
  rows: LedgerRow[];
  corrupt: number[];
}

/** What an entry costs the cache bound: its rows, at least one. */
function weightOf(entry: LedgerEntry): number {
  return Math.max(1, entry.rows.length);
}

function parseRow(line: string): LedgerRow | undefined {
  try {
    const parsed = LedgerRowSchema.safeParse(JSON.parse(line));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // already closed
  }
}
