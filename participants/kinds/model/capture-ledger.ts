import { closeSync, fstatSync, ftruncateSync, open as openFd, writeSync } from "node:fs";
import { promisify } from "node:util";
import { appendFile, mkdir, readFile, readdir, rename, truncate, unlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { parseCaptureKey } from "../../../protocol/index.js";
import { LedgerRowSchema, type LedgerRow } from "./ledger-row.js";
import { StripedLocks } from "./striped-locks.js";

const SUFFIX = ".lineage.jsonl";
const openAsync = promisify(openFd);

/** Writes bytes at the descriptor's position (append); returns how many were written. A seam for tests. */
export type LedgerWrite = (fd: number, buffer: Buffer, offset: number) => number;

export interface CaptureLedgerOptions {
  write?: LedgerWrite;
  /** Told once per load of a ledger file with unreadable lines (1-based line numbers). */
  onCorrupt?: (path: string, lines: number[]) => void;
}

/**
 * The capture ledger: per capture key, an append-only JSONL file of lineage rows
 * (`<dir>/<capture_key>.lineage.jsonl`), guarded by a bounded set of striped lock files
 * (`<dir>/locks/stripe-NNNN.lock`). Reads go through an in-memory copy that is loaded once per
 * key, so resolving a call's parent never touches the disk on the hot path. Appends reuse an open
 * descriptor per key (at most `maxHandles`, least recently used closed first) and write
 * synchronously: a few-hundred-byte page-cache append costs ~3 µs inline, against ~20 µs of CPU
 * and a thread-pool round trip for an asynchronous write (and an open/close per row before).
 * Creating a file stays asynchronous (it costs far more). Which keys have a file is listed once at
 * start-up and kept current, so a new rollout's first call never probes the disk: the directory
 * belongs to one model server process at a time.
 *
 * A row enters memory only once its whole line is in the file. A write that fails part way (a full
 * disk, an I/O error) is cut off again (truncated back to the size before it) so nothing is glued to
 * it; if even that fails, the key is truncated before its next append. A line in the middle that is
 * not a row (damage from outside) does not make the key unusable: its rows load, new calls append,
 * and the key reports its unreadable lines (`corruptLines`), which export refuses to paper over.
 */
export class CaptureLedger {
  readonly locks: StripedLocks;
  private readonly cache = new Map<string, LedgerRow[]>();
  /** Open append descriptors in LRU order. Writes are synchronous, so closing one never races a write. */
  private readonly handles = new Map<string, number>();
  /** Keys with a ledger file, listed at start-up and kept current. */
  private readonly onDisk = new Set<string>();
  /** Loaded keys whose file has lines that are not rows (1-based line numbers). */
  private readonly corrupt = new Map<string, number[]>();
  /** Keys whose failed write could not be cut off: the file is truncated to this size before the next append. */
  private readonly repair = new Map<string, number>();
  private readonly write: LedgerWrite;
  private readonly ready: Promise<void>;

  constructor(
    readonly dir: string,
    stripes = 16,
    private readonly maxHandles = 256,
    private readonly options: CaptureLedgerOptions = {},
  ) {
    this.write = options.write ?? ((fd, buffer, offset) => writeSync(fd, buffer, offset));
    this.locks = new StripedLocks(join(dir, "locks"), stripes);
    this.ready = mkdir(dir, { recursive: true }).then(async () => {
      for (const key of await this.listKeys()) this.onDisk.add(key);
    });
  }

  fileOf(key: string): string {
    // Keys already known here were validated when they were first seen.
    if (!this.cache.has(key) && !this.onDisk.has(key) && !parseCaptureKey(key)) throw new Error(`not a capture key: ${key}`);
    return join(this.dir, `${key}${SUFFIX}`);
  }

  /** The rows of a capture key, loaded from disk on first use. */
  async rows(key: string): Promise<readonly LedgerRow[]> {
    const cached = this.cache.get(key);
    if (cached) return cached;
    await this.ready;
    return this.locks.run(key, async () => {
      const again = this.cache.get(key);
      if (again) return again;
      const loaded = this.onDisk.has(key) ? await this.readFile(key) : { rows: [], corrupt: [] };
      this.cache.set(key, loaded.rows);
      if (loaded.corrupt.length) {
        this.corrupt.set(key, loaded.corrupt);
        this.options.onCorrupt?.(this.fileOf(key), loaded.corrupt);
      }
      return loaded.rows;
    });
  }

  /** 1-based numbers of the lines of a loaded key's file that are not rows (empty when none). */
  corruptLines(key: string): readonly number[] {
    return this.corrupt.get(key) ?? [];
  }

  /**
   * Appends one row: the whole line goes to the file, then the row to the in-memory copy (when the
   * key is loaded), so a following call sees it as soon as the promise resolves. On a failed write
   * the promise rejects and neither the file nor memory keeps any of it.
   */
  async append(row: LedgerRow): Promise<void> {
    const parsed = LedgerRowSchema.parse(row);
    const key = parsed.capture_key;
    const line = Buffer.from(`${JSON.stringify(parsed)}\n`);
    await this.ready;
    await this.locks.run(key, async () => {
      const fd = this.handles.get(key) ?? (await this.openAppend(key));
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
        throw error;
      }
      this.onDisk.add(key);
      this.cache.get(key)?.push(parsed);
    });
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

  /** Closes every append descriptor and releases the lock files. */
  async close(): Promise<void> {
    await this.ready;
    for (const fd of this.handles.values()) closeQuietly(fd);
    this.handles.clear();
    await this.locks.close();
  }

  /** Under the key's stripe lock: marks the descriptor most recently used. */
  private touch(key: string, fd: number): void {
    this.handles.delete(key);
    this.handles.set(key, fd);
    if (this.handles.size <= this.maxHandles) return;
    const [oldest, old] = this.handles.entries().next().value as [string, number];
    this.handles.delete(oldest);
    closeQuietly(old);
  }

  /** Under the key's stripe lock: opens (creating) the key's file for appends, off the event loop. */
  private async openAppend(key: string): Promise<number> {
    return openAsync(this.fileOf(key), "a");
  }

  /** Under the key's stripe lock: the file is about to be renamed over or removed. */
  private dropHandle(key: string): void {
    const fd = this.handles.get(key);
    if (fd === undefined) return;
    this.handles.delete(key);
    closeQuietly(fd);
  }

  /** Replaces a key's ledger with `rows` (atomic rename). */
  async replace(key: string, rows: LedgerRow[]): Promise<void> {
    const checked = rows.map((r) => LedgerRowSchema.parse(r));
    await this.ready;
    await this.locks.run(key, async () => {
      const path = this.fileOf(key);
      const tmp = `${path}.tmp-${process.pid}`;
      this.dropHandle(key);
      await writeFile(tmp, checked.map((r) => `${JSON.stringify(r)}\n`).join(""));
      await rename(tmp, path);
      this.cache.set(key, checked);
      this.corrupt.delete(key);
      this.repair.delete(key);
      this.onDisk.add(key);
    });
  }

  /** Deletes the ledgers of these keys (memory and disk). */
  async remove(keys: Iterable<string>): Promise<void> {
    await this.ready;
    for (const key of keys) {
      await this.locks.run(key, async () => {
        const path = this.fileOf(key);
        this.cache.delete(key);
        this.corrupt.delete(key);
        this.repair.delete(key);
        this.onDisk.delete(key);
        this.dropHandle(key);
        await unlink(path).catch((error: NodeJS.ErrnoException) => {
          if (error.code !== "ENOENT") throw error;
        });
      });
    }
  }

  /** Capture keys of a rollout that have a ledger here (on disk or in memory), by attempt. */
  async keysOfRollout(rolloutId: string): Promise<{ key: string; attempt: number }[]> {
    await this.ready;
    const keys = new Set<string>(await this.listKeys());
    for (const key of this.cache.keys()) keys.add(key);
    const out: { key: string; attempt: number }[] = [];
    for (const key of keys) {
      const episode = parseCaptureKey(key);
      if (episode && episode.rollout_id === rolloutId) out.push({ key, attempt: episode.attempt });
    }
    return out.sort((a, b) => a.attempt - b.attempt);
  }

  /** Drops the in-memory copy only (forget): the files stay for whoever consumes them. */
  evict(rolloutId: string): void {
    for (const key of [...this.cache.keys()]) {
      if (parseCaptureKey(key)?.rollout_id !== rolloutId) continue;
      this.cache.delete(key);
      this.corrupt.delete(key);
    }
  }

  /** Capture keys with a ledger file in the directory. */
  private async listKeys(): Promise<string[]> {
    const keys: string[] = [];
    for (const name of await readdir(this.dir)) {
      const key = name.endsWith(SUFFIX) ? name.slice(0, -SUFFIX.length) : null;
      if (key !== null && parseCaptureKey(key)) keys.push(key);
    }
    return keys;
  }

  /** Under the key's stripe lock: the file's rows, and the numbers of its lines that are not rows. */
  private async readFile(key: string): Promise<{ rows: LedgerRow[]; corrupt: number[] }> {
    const path = this.fileOf(key);
    let text: string;
    try {
      text = await readFile(path, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return { rows: [], corrupt: [] };
      throw error;
    }
    const lines = text.split("\n");
    const rows: LedgerRow[] = [];
    const corrupt: number[] = [];
    for (const [index, line] of lines.slice(0, -1).entries()) {
      if (!line.trim()) continue;
      const row = parseRow(line);
      if (row) rows.push(row);
      else corrupt.push(index + 1);
    }
    // What follows the last newline is an append a crash (or a full disk) cut short. It must not
    // stay: the next append would join it into one invalid line. A complete row keeps its place.
    const tail = lines.at(-1)!;
    if (tail !== "") {
      const row = parseRow(tail);
      if (row) {
        await appendFile(path, "\n");
        rows.push(row);
      } else {
        await truncate(path, Buffer.byteLength(text) - Buffer.byteLength(tail));
      }
    }
    return { rows, corrupt };
  }
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
