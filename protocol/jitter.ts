/** A random source in [0, 1] (Math.random's [0, 1) by default); injected so tests pin a retry's wait. */
export type RandomSource = () => number;

/**
 * "Equal jitter" for a retry's wait: half of `ms` kept, the other half drawn at random. Retries
 * that started at one instant (many sessions refused at once, coordinators that lost a watch in
 * one NATS restart) spread over the second half instead of all landing together, while each still
 * waits at least half the grown wait and never more than it.
 */
export function equalJitter(ms: number, random: RandomSource = Math.random): number {
  return Math.round(ms / 2 + (ms / 2) * random());
}
