import { setTimeout as sleep } from "node:timers/promises";
import { timerDelay } from "../../protocol/index.js";

/**
 * Resolves after `seconds`, or at once when `until` aborts (its timer cleared). A pause is the
 * collection's work: its timer keeps the process alive, since nothing else may (over --http-url no
 * NATS connection does), and an unref'd one let Node exit mid-collection with nothing said. A bound
 * raced against other work passes `until`, aborted once the race is over, so it never outlives it.
 */
export function delay(seconds: number, until?: AbortSignal): Promise<void> {
  // The abort's AbortError only ends the pause early.
  return sleep(timerDelay(seconds * 1000), undefined, until && { signal: until }).catch(() => undefined);
}
