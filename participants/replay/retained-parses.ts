import { stat } from "node:fs/promises";

/**
 * What a failed reload parsed of one file, kept so the next reload need not read it again: its
 * tasks (numbered from `base`), its read statistics, the identity the file had when it was read,
 * and what it costs to keep (the record bytes parsed, an upper bound on what its tasks hold).
 */
export interface RetainedParse<V> {
  identity: string;
  base: number;
  value: V;
  cost: number;
}

/**
 * A file's identity: device, inode, size, modification and change time (in nanoseconds). A file
 * replaced (another inode), appended to or rewritten has another, and is read again. Null when it
 * cannot be had: nothing is kept for that file.
 */
export async function fileIdentity(file: string): Promise<string | null> {
  try {
    const s = await stat(file, { bigint: true });
    return `${s.dev}:${s.ino}:${s.size}:${s.mtimeNs}:${s.ctimeNs}`;
  } catch {
    return null;
  }
}

/**
 * The parses of one reload attempt, keyed by real path, up to `maxCost` in all (files in reload
 * order, each kept while it fits). A failed reload's set replaces the previous one; a reload that
 * succeeds needs none (its files are loaded for good).
 */
export class RetainedParses<V> {
  private readonly kept = new Map<string, RetainedParse<V>>();
  private spent = 0;

  constructor(private readonly maxCost: number) {}

  /** The parse kept for `real` when the file still has `identity`. */
  get(real: string, identity: string | null): RetainedParse<V> | undefined {
    const kept = identity === null ? undefined : this.kept.get(real);
    return kept?.identity === identity ? kept : undefined;
  }

  /** Keeps `parse` if it fits in what is left of the bound. */
  keep(real: string, parse: RetainedParse<V>): void {
    if (this.spent + parse.cost > this.maxCost) return;
    this.spent += parse.cost;
    this.kept.set(real, parse);
  }
}
