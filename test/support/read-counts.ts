/**
 * Operation counts for scale tests, which assert how much work an operation does at a count rather
 * than how long it takes (never a wall-clock bound).
 */

/** `items` as an array that counts its element reads (`array[i]`, as `some`, `find` and `for…of` do). */
export function countingReads<T>(items: T[]): { array: T[]; reads: () => number } {
  let reads = 0;
  const array = new Proxy(items, {
    get(target, property, receiver) {
      if (typeof property === "string" && /^\d+$/.test(property)) reads++;
      return Reflect.get(target, property, receiver) as unknown;
    },
  });
  return { array, reads: () => reads };
}

/** Counts every key or entry iterated out of `collection` (a Map's or Set's keys, values, entries, spread) from now on. */
export function countingVisits(collection: Map<unknown, unknown> | Set<unknown>): () => number {
  let visits = 0;
  const target = collection as unknown as Record<string | symbol, unknown>;
  for (const method of ["keys", "values", "entries", Symbol.iterator] as const) {
    const original = (target[method] as () => Iterator<unknown>).bind(collection);
    target[method] = function* () {
      for (const item of { [Symbol.iterator]: original }) {
        visits++;
        yield item;
      }
    };
  }
  return () => visits;
}
