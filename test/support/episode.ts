import type { EpisodeId } from "../../protocol/index.js";

/** An episode id for tests: `ep("r1")` is attempt 0. */
export const ep = (rollout_id: string, attempt = 0): EpisodeId => ({ rollout_id, attempt });
