import { Agent } from "undici";

/**
 * An HTTP dispatcher without undici's own 300 s limits: fetch's default dispatcher gives up when no
 * response headers arrive within 300 s, or 300 s pass between two body chunks, checkpoint pauses
 * included. Calls that may legitimately last longer (a controller op running to its deadline, a
 * Gym `/run` or an agent's `activate` parked through a checkpoint, a policy response held by the
 * model, a judge call configured longer than 300 s) pass it, with their own abort signal as the
 * only bound. Not exported by index.ts.
 */
export const UNTIMED_DISPATCHER = new Agent({ headersTimeout: 0, bodyTimeout: 0 });

/** The same dispatcher typed for the global fetch, whose types are Node's copy of undici, not the npm package's. */
export const UNTIMED_FETCH_DISPATCHER = UNTIMED_DISPATCHER as unknown as RequestInit["dispatcher"];
