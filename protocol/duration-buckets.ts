/**
 * Bucket boundaries (seconds) of every `(s)` duration histogram, coordinator and participants
 * alike. Passed as instrument advice: the SDK's default boundaries (0, 5, 10, … 10000) are meant
 * for milliseconds and would put every checkpoint op in the first bucket or two.
 */
export const DURATION_BUCKETS_S: readonly number[] = Object.freeze([
  0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
]);
