import { createHash } from "node:crypto";

/** A source of uniform numbers in [0, 1). */
export type Random = () => number;

/** Builds the generator for one key; injectable so tests and workers can pin draws. */
export type RandomFactory = (key: string) => Random;

/**
 * Deterministic generator keyed by a string (sfc32 seeded from sha256 of the key).
 * Keying by "<seed>:<trace id>" makes a draw depend on the record alone, not on file order or worker.
 */
export const seededRandom: RandomFactory = (key) => {
  const digest = createHash("sha256").update(key).digest();
  let a = digest.readUInt32LE(0);
  let b = digest.readUInt32LE(4);
  let c = digest.readUInt32LE(8);
  let d = digest.readUInt32LE(12);
  return () => {
    const t = (((a + b) | 0) + d) | 0;
    d = (d + 1) | 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) | 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) | 0;
    return (t >>> 0) / 4294967296;
  };
};

/** k distinct positions of 0..n-1 drawn uniformly (partial Fisher–Yates), returned ascending. */
export function sampleSorted(n: number, k: number, random: Random): number[] {
  const pool = Array.from({ length: n }, (_, i) => i);
  const take = Math.min(k, n);
  for (let i = 0; i < take; i++) {
    const j = i + Math.floor(random() * (n - i));
    [pool[i], pool[j]] = [pool[j]!, pool[i]!];
  }
  return pool.slice(0, take).sort((x, y) => x - y);
}
