import { randomBytes } from "node:crypto";
import { unlinkSync } from "node:fs";
import { link, readdir, rm, stat, unlink, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { makeDirectories, namePath } from "../../../protocol/index.js";
import { readIfExists, takeOverStale } from "../../../protocol/lock-takeover.js";
import { parseProcessIdentity, processIdentity, whyOwnerGone } from "../../../protocol/process-identity.js";
import { AsyncLock } from "../../control-plane/async-lock.js";
import { filesystemClock, readOnceAdvancing, type DirectoryClock } from "../../storage/filesystem-clock.js";
import { removeStaleProbeFiles } from "../../storage/stale-probe-files.js";

/**
 * A bounded set of lock files guarding per-rollout ledger files: a key maps to one of `stripes`
 * lock files by hash, so the lock directory never holds more than `stripes` files however many
 * rollouts there are.
 *
 * Within a process a FIFO mutex per stripe serializes. Across processes a stripe is OWNED: its
 * lock file (holding the owner's pid and process token) is placed on first use and kept while the stripe
 * is busy, so the hot path (one ledger row per generation call) costs no file-system call at all.
 * A stripe idle for `idleMs` is released (its file removed) so another process can take it; every
 * owned stripe is released on close() and at process exit; a lock file whose owner died is broken.
 *
 * A lock file appears whole: it is a hard link to this instance's owner file (`.owner-<token>`,
 * written once, removed on close() and at exit), made only where the name is absent. So taking an
 * uncontended stripe is one link(2), and no live owner's lock file is ever empty: one created empty
 * then written was taken for a dead writer's once its owner stalled past the empty-file grace.
 * A dead owner's lock is broken one process at a time, which judges the file again
 * (protocol/lock-takeover.ts): two processes that judged the same dead owner's file would otherwise
 * both remove "it", the second removing the first's fresh lock, and both append to one ledger file.
 */
export class StripedLocks {
  private readonly local: AsyncLock[];
  private readonly ready: Promise<void>;
  /**
   * Stripes whose lock file this process holds, with the time of their last use (performance.now():
   * an idle time within this process, which a wall-clock step must not stretch or cut).
   */
  private readonly owned = new Map<number, number>();
  private sweeper: NodeJS.Timeout | undefined;
  private closed = false;
  /** Work accepted by run() and not settled yet: close() lets it finish first. */
  private readonly accepted = new Set<Promise<unknown>>();
  /** What this instance's lock files are hard links to; written on first acquisition. */
  private readonly ownerFile: string;
  private ownerWritten: Promise<void> | undefined;

  constructor(
    readonly dir: string,
    readonly stripes = 16,
    private readonly waitMs = 10_000,
    private readonly idleMs = 1_000,
    /** Told when a lock file could not be removed (the stripe stays owned and is released again later). */
    private readonly onReleaseFailed?: (lockFile: string, error: unknown) => void,
  ) {
    if (!Number.isInteger(stripes) || stripes < 1 || stripes > 1024) throw new Error("stripes must be an integer in 1..1024");
    this.local = Array.from({ length: stripes }, () => new AsyncLock());
    this.ownerFile = join(dir, `${OWNER_FILE_PREFIX}${randomBytes(6).toString("hex")}`);
    this.ready = makeDirectories(dir, { mode: 0o700 }).then(() => undefined);
    this.ready.catch(() => undefined); // a directory that cannot be made is every use's error, not the process's
  }

  /** FNV-1a: stable across processes, so every process maps a key to the same stripe. */
  stripeOf(key: string): number {
    let hash = 0x811c9dc5;
    for (let i = 0; i < key.length; i++) {
      hash ^= key.charCodeAt(i);
      hash = Math.imul(hash, 0x01000193) >>> 0;
    }
    return hash % this.stripes;
  }

  lockFile(stripe: number): string {
    return join(this.dir, `stripe-${String(stripe).padStart(4, "0")}.lock`);
  }

  /** Stripes whose lock file this process currently holds. */
  ownedStripes(): number[] {
    return [...this.owned.keys()].sort((a, b) => a - b);
  }

  /** Runs `fn` holding the key's stripe; refused once close() was called, but work accepted before runs. */
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(new Error("ledger locks are closed"));
    const work = this.runOnStripe(key, fn);
    this.accepted.add(work);
    const settled = () => void this.accepted.delete(work);
    work.then(settled, settled);
    return work;
  }

  /**
   * The hot path (one ledger row per generation call): runs `fn` at once, with no microtask turn,
   * when the key's stripe is this process's and free and no other work is pending here; returns
   * false without running it otherwise (the caller then uses `run`). Running now is what `run`
   * would do, minus the turns: nothing is queued before it.
   */
  runNowIfFree(key: string, fn: () => void): boolean {
    if (this.closed || this.accepted.size > 0) return false;
    const stripe = this.stripeOf(key);
    if (!this.owned.has(stripe) || !this.local[stripe]!.idle) return false;
    try {
      fn();
    } finally {
      this.owned.set(stripe, performance.now());
    }
    return true;
  }

  private async runOnStripe<T>(key: string, fn: () => Promise<T>): Promise<T> {
    await this.ready;
    const stripe = this.stripeOf(key);
    return this.local[stripe]!.run(async () => {
      if (!this.owned.has(stripe)) {
        await this.acquire(this.lockFile(stripe));
        this.owned.set(stripe, performance.now());
        OWNERS.add(this);
        this.sweep();
      }
      try {
        return await fn();
      } finally {
        this.owned.set(stripe, performance.now());
      }
    });
  }

  /** Refuses further use, lets the work already accepted finish, then releases every owned stripe. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.sweeper);
    this.sweeper = undefined;
    // The directory's mkdir may still be in flight (a ledger closed right after it opened): once
    // close() returns nothing of ours may still create entries (a caller removing the tree would race it).
    await this.ready.catch(() => undefined);
    while (this.accepted.size) await Promise.allSettled([...this.accepted]);
    await Promise.all([...this.owned.keys()].map((stripe) => this.local[stripe]!.run(() => this.release(stripe))));
    // A lock file that could not be removed is still ours: the exit hook tries it again.
    if (this.owned.size === 0) OWNERS.delete(this);
    if (this.ownerWritten) {
      await this.ownerWritten.catch(() => undefined);
      await rm(this.ownerFile, { force: true });
      OWNER_FILES.delete(this.ownerFile);
    }
  }

  /** Releases stripes idle for `idleMs`; re-arms itself while any stripe is owned. */
  private sweep(): void {
    if (this.sweeper || this.closed) return;
    this.sweeper = setTimeout(() => {
      this.sweeper = undefined;
      const now = performance.now();
      const idle = [...this.owned].filter(([, used]) => now - used >= this.idleMs).map(([stripe]) => stripe);
      void Promise.all(
        idle.map((stripe) =>
          this.local[stripe]!.run(async () => {
            const used = this.owned.get(stripe);
            if (used !== undefined && performance.now() - used >= this.idleMs) await this.release(stripe);
          }),
        ),
      ).finally(() => {
        if (this.owned.size > 0) this.sweep();
        else OWNERS.delete(this);
      });
    }, this.idleMs);
    this.sweeper.unref();
  }

  /**
   * Removes the stripe's lock file; the stripe is no longer owned only once the file is gone. One that
   * cannot be removed (an I/O error) still holds this process's identity, which this process would then
   * wait on as another live owner's: the stripe stays owned (usable at once) and the next sweep, close
   * or the exit hook tries again. Never throws: a release is housekeeping, not the work it followed.
   */
  private async release(stripe: number): Promise<void> {
    if (!this.owned.has(stripe)) return;
    const file = this.lockFile(stripe);
    try {
      await unlink(file);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") {
        this.onReleaseFailed?.(file, error);
        return;
      }
    }
    this.owned.delete(stripe);
  }

  /** Exit hook: drop this process's lock files synchronously. */
  releaseAllSync(): void {
    for (const stripe of this.owned.keys()) {
      try {
        unlinkSync(this.lockFile(stripe));
      } catch {
        // already gone
      }
    }
    this.owned.clear();
  }

  private async acquire(path: string): Promise<void> {
    // How long this process waits: monotonic. (A lock file's age, from its mtime, is wall time: whyStale.)
    const until = performance.now() + this.waitMs;
    // The directory's clock, for an empty file's age: one probe for the whole wait, not one per look.
    const clock = readOnceAdvancing(filesystemClock);
    for (let attempt = 0; ; attempt++) {
      if (await this.place(path)) return;
      const held = await readIfExists(path);
      if (held !== undefined && (await whyStale(path, held, clock)) !== undefined) {
        const taken = await takeOverStale(path, (now) => whyStale(path, now, clock), () => this.place(path));
        if (taken?.held) return;
        // A live owner took it first, or another process is taking it over: wait like for any owner.
      }
      // No path in the message: it may reach an HTTP caller as the detail of an internal_error.
      if (performance.now() > until) throw new Error(`ledger lock ${basename(path)} is held by another live process`);
      await new Promise((resolve) => setTimeout(resolve, Math.min(2 + attempt, 20)));
    }
  }

  /** Links the owner file to `path`; false where the name exists. */
  private async place(path: string): Promise<boolean> {
    for (let tries = 1; ; tries++) {
      const written = this.ownerFileWritten();
      await written;
      try {
        await link(this.ownerFile, path);
        return true;
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code === "EEXIST") return false;
        // Our owner file removed from outside: written again, once (where the directory is gone, that fails).
        if (code !== "ENOENT" || tries >= 2) throw error;
        if (this.ownerWritten === written) this.ownerWritten = undefined;
      }
    }
  }

  /** The owner file's write, started on first use; one that failed is tried again by the next use. */
  private ownerFileWritten(): Promise<void> {
    if (this.ownerWritten) return this.ownerWritten;
    const written = this.writeOwnerFile();
    this.ownerWritten = written;
    written.catch(() => {
      if (this.ownerWritten === written) this.ownerWritten = undefined;
    });
    return written;
  }

  /** Writes the owner file, after removing those of processes that no longer run (a crash leaves its own). */
  private async writeOwnerFile(): Promise<void> {
    const names = await readdir(this.dir);
    // One clock reading for the sweep's every judgement.
    const clock = readOnceAdvancing(filesystemClock);
    // whyStale's clock probes (stale-probe-files.ts): what a crash left between a probe's create and remove.
    await removeStaleProbeFiles(this.dir, names, clock);
    for (const name of names) {
      if (!name.startsWith(OWNER_FILE_PREFIX)) continue;
      const path = join(this.dir, name);
      const text = await readIfExists(path).catch(() => undefined);
      if (text !== undefined && (await whyStale(path, text, clock)) !== undefined) await rm(path, { force: true });
    }
    OWNER_FILES.add(this.ownerFile);
    await writeFile(this.ownerFile, OWNER, { flag: "wx" }).catch(async (error: NodeJS.ErrnoException) => {
      // Created, then not written in full (a full disk): removed, or the retry's exclusive create fails (EEXIST).
      await rm(this.ownerFile, { force: true }).catch(() => undefined);
      throw namePath(error, this.ownerFile); // a failed write on the handle names no path (ENOSPC): the refusal should
    });
  }
}

/** Instances holding lock files, and owner files not removed yet; one process-wide exit hook removes them. */
const OWNERS = new Set<StripedLocks>();
const OWNER_FILES = new Set<string>();
process.once("exit", () => {
  for (const locks of OWNERS) locks.releaseAllSync();
  for (const file of OWNER_FILES) {
    try {
      unlinkSync(file);
    } catch {
      // already gone
    }
  }
});

const OWNER_FILE_PREFIX = ".owner-";

/**
 * What a lock file holds: the owner's pid, a token of its own and, where /proc has them, its start
 * time and the boot id (protocol/process-identity.ts). A pid alone is not enough: a restarted
 * container's process is PID 1 again and would take its predecessor's files for its own, and after
 * a crash an unrelated process may hold the dead owner's pid, which must not keep the stripe locked for good.
 */
const OWN_IDENTITY = processIdentity();
const OWNER = [process.pid, randomBytes(8).toString("hex"), ...(OWN_IDENTITY ? [OWN_IDENTITY.startTime, OWN_IDENTITY.bootId] : [])].join(" ");

/** An empty lock file older than this was left by a writer that died between create and write (versions that wrote it in place). */
const EMPTY_LOCK_GRACE_MS = 2_000;

/**
 * Why a lock (or owner) file's owner no longer runs; undefined while it may. An empty file's age is
 * judged by the directory's own clock (filesystem-clock.ts), not Date.now(): its mtime is the file
 * server's clock on NFS, and a host ahead of it would break a live writer's fresh file. Where that
 * clock cannot be read, an empty file is not judged stale. `clock`: the caller's reading of it
 * (`readOnceAdvancing`), so a wait looking again and again makes one probe.
 */
async function whyStale(path: string, content: string, clock: DirectoryClock): Promise<string | undefined> {
  const text = content.trim();
  if (text === "") {
    // Read before the file's mtime: a write landing in between only makes it look younger.
    const now = await clock(dirname(path));
    if (now === undefined) return undefined;
    const info = await stat(path).catch(() => undefined);
    return info !== undefined && now - info.mtimeMs > EMPTY_LOCK_GRACE_MS ? "left empty" : undefined;
  }
  const [pidText, , startedAt, bootId] = text.split(" ");
  const pid = Number(pidText);
  if (!Number.isInteger(pid) || pid <= 0) return "unreadable content";
  // Our pid: held by this process (another ledger here) only if it carries our token.
  if (pid === process.pid) return text === OWNER ? undefined : "left by an earlier process with this pid";
  if (startedAt === undefined || bootId === undefined) return whyOwnerGone(pid, undefined);
  // An identity no process of this boot writes is no owner.
  const identity = parseProcessIdentity(startedAt, bootId);
  return identity === undefined ? "unreadable content" : whyOwnerGone(pid, identity);
}
