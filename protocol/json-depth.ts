/**
 * Deepest nesting of arrays and objects a JSON value from outside may have. Schemas (zod's
 * `z.json()`), canonical JSON and digests walk values recursively: a small body nested a few
 * thousand levels deep would overflow the stack and answer 500 instead of a refusal.
 */
export const MAX_JSON_DEPTH = 128;

/** Whether `value` nests arrays or objects more than `max` levels deep (iterative, so it cannot overflow itself). */
export function jsonNestsDeeperThan(value: unknown, max: number = MAX_JSON_DEPTH): boolean {
  const pending: [unknown, number][] = [[value, 1]];
  while (pending.length > 0) {
    const [node, depth] = pending.pop()!;
    if (node === null || typeof node !== "object") continue;
    if (depth > max) return true;
    for (const child of Array.isArray(node) ? node : Object.values(node)) {
      if (child !== null && typeof child === "object") pending.push([child, depth + 1]);
    }
  }
  return false;
}
