import { mkdir, open, readFile, unlink } from "node:fs/promises";
import { join } from "node:path";
import { AsyncLock } from "../../control-plane/async-lock.js";

/**
 * A bounded set of lock files guarding per-rollout ledger files: a key maps to one of `stripes`
 * lock files by hash, so the lock directory never holds more than `stripes` files however many
 * rollouts there are. Within a process a FIFO mutex per stripe serializes; across processes the
 * stripe's lock file is created exclusively (holding the owner's pid) and removed on release; a
 * lock file whose owner died is broken.
 */
export class StripedLocks {
  private readonly local: AsyncLock[];
  private readonly ready: Promise<void>;

  constructor(
    readonly dir: string,
    readonly stripes = 16,
    private readonly waitMs = 10_000,
  ) {
    if (!Number.isInteger(stripes) || stripes < 1 || stripes > 1024) throw new Error("stripes must be an integer in 1..1024");
    this.local = Array.from({ length: stripes }, () => new AsyncLock());
    this.ready = mkdir(dir, { recursive: true }).then(() => undefined);
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

  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    await this.ready;
    const stripe = this.stripeOf(key);
    return this.local[stripe]!.run(async () => {
      const path = this.lockFile(stripe);
      await this.acquire(path);
      try {
        return await fn();
      } finally {
        await unlink(path).catch(() => undefined);
      }
    });
  }

  private async acquire(path: string): Promise<void> {
    const until = Date.now() + this.waitMs;
    for (let attempt = 0; ; attempt++) {
      try {
        const handle = await open(path, "wx");
        await handle.writeFile(String(process.pid));
        await handle.close();
        return;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      }
      if (await ownerIsDead(path)) {
        await unlink(path).catch(() => undefined);
        continue;
      }
      if (Date.now() > until) throw new Error(`ledger lock ${path} is held by a live process`);
      await new Promise((resolve) => setTimeout(resolve, Math.min(2 + attempt, 20)));
    }
  }
}

async function ownerIsDead(path: string): Promise<boolean> {
  const text = await readFile(path, "utf8").catch(() => "");
  const pid = Number(text);
  if (!Number.isInteger(pid) || pid <= 0) return text.length > 0; // an unreadable/empty file may be mid-write
  if (pid === process.pid) return false;
  try {
    process.kill(pid, 0);
    return false;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "ESRCH";
  }
}
