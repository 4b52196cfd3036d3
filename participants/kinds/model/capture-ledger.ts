import { mkdir, open, readFile, readdir, rename, unlink, writeFile, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { parseCaptureKey } from "../../../protocol/index.js";
import { LedgerRowSchema, type LedgerRow } from "./ledger-row.js";
import { StripedLocks } from "./striped-locks.js";

const SUFFIX = ".lineage.jsonl";

/**
 * The capture ledger: per capture key, an append-only JSONL file of lineage rows
 * (`<dir>/<capture_key>.lineage.jsonl`), guarded by a bounded set of striped lock files
 * (`<dir>/locks/stripe-NNNN.lock`). Reads go through an in-memory copy that is loaded once per
 * key, so resolving a call's parent never touches the disk on the hot path. Appends reuse an open
 * file handle per key (a few per stripe, least recently used closed first), so a row costs one
 * write, not an open/write/close.
 */
export class CaptureLedger {
  readonly locks: StripedLocks;
  private readonly cache = new Map<string, LedgerRow[]>();
  /** Open append handles per stripe (touched only under that stripe's lock), in LRU order. */
  private readonly handles: Map<string, FileHandle>[];
  private readonly ready: Promise<void>;

  constructor(
    readonly dir: string,
    stripes = 16,
    private readonly handlesPerStripe = 8,
  ) {
    this.locks = new StripedLocks(join(dir, "locks"), stripes);
    this.handles = Array.from({ length: stripes }, () => new Map());
    this.ready = mkdir(dir, { recursive: true }).then(() => undefined);
  }

  fileOf(key: string): string {
    if (!parseCaptureKey(key)) throw new Error(`not a capture key: ${key}`);
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
      const loaded = await this.readFile(key);
      this.cache.set(key, loaded);
      return loaded;
    });
  }

  /** Appends one row; the in-memory copy changes first, so a following call sees it at once. */
  async append(row: LedgerRow): Promise<void> {
    const parsed = LedgerRowSchema.parse(row);
    const rows = await this.rows(parsed.capture_key);
    (rows as LedgerRow[]).push(parsed);
    await this.locks.run(parsed.capture_key, async () => {
      const handle = await this.appendHandle(parsed.capture_key);
      await handle.write(`${JSON.stringify(parsed)}\n`);
    });
  }

  /** Closes every append handle and releases the lock files. */
  async close(): Promise<void> {
    await this.ready;
    for (const stripe of this.handles) {
      for (const handle of stripe.values()) await handle.close().catch(() => undefined);
      stripe.clear();
    }
    await this.locks.close();
  }

  /** Under the key's stripe lock. */
  private async appendHandle(key: string): Promise<FileHandle> {
    const stripe = this.handles[this.locks.stripeOf(key)]!;
    const open_ = stripe.get(key);
    if (open_) {
      stripe.delete(key);
      stripe.set(key, open_);
      return open_;
    }
    if (stripe.size >= this.handlesPerStripe) {
      const [oldest, handle] = stripe.entries().next().value as [string, FileHandle];
      stripe.delete(oldest);
      await handle.close().catch(() => undefined);
    }
    const handle = await open(this.fileOf(key), "a");
    stripe.set(key, handle);
    return handle;
  }

  /** Under the key's stripe lock: the file is about to be renamed over or removed. */
  private async dropHandle(key: string): Promise<void> {
    const stripe = this.handles[this.locks.stripeOf(key)]!;
    const handle = stripe.get(key);
    if (!handle) return;
    stripe.delete(key);
    await handle.close().catch(() => undefined);
  }

  /** Replaces a key's ledger with `rows` (atomic rename). */
  async replace(key: string, rows: LedgerRow[]): Promise<void> {
    const checked = rows.map((r) => LedgerRowSchema.parse(r));
    await this.ready;
    await this.locks.run(key, async () => {
      const path = this.fileOf(key);
      const tmp = `${path}.tmp-${process.pid}`;
      await this.dropHandle(key);
      await writeFile(tmp, checked.map((r) => `${JSON.stringify(r)}\n`).join(""));
      await rename(tmp, path);
      this.cache.set(key, checked);
    });
  }

  /** Deletes the ledgers of these keys (memory and disk). */
  async remove(keys: Iterable<string>): Promise<void> {
    await this.ready;
    for (const key of keys) {
      await this.locks.run(key, async () => {
        this.cache.delete(key);
        await this.dropHandle(key);
        await unlink(this.fileOf(key)).catch((error: NodeJS.ErrnoException) => {
          if (error.code !== "ENOENT") throw error;
        });
      });
    }
  }

  /** Capture keys of a rollout that have a ledger here (on disk or in memory), by attempt. */
  async keysOfRollout(rolloutId: string): Promise<{ key: string; attempt: number }[]> {
    await this.ready;
    const keys = new Set<string>();
    for (const name of await readdir(this.dir)) if (name.endsWith(SUFFIX)) keys.add(name.slice(0, -SUFFIX.length));
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
    for (const key of [...this.cache.keys()]) if (parseCaptureKey(key)?.rollout_id === rolloutId) this.cache.delete(key);
  }

  private async readFile(key: string): Promise<LedgerRow[]> {
    let text: string;
    try {
      text = await readFile(this.fileOf(key), "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw error;
    }
    const rows: LedgerRow[] = [];
    for (const line of text.split("\n")) {
      if (!line.trim()) continue;
      // A torn last line (a crash mid-append) is dropped; every complete line must be valid.
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        continue;
      }
      rows.push(LedgerRowSchema.parse(value));
    }
    return rows;
  }
}
