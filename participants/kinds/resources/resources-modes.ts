import { z } from "zod";

/**
 * Class-level declarations of a resources server. They describe what the server's code can do,
 * so they live on the class, not in configuration.
 *
 * - `restart_only` (default, fails closed): nothing is checkpointed; live sessions are restarts.
 * - `stateless`: sessions hold nothing a continuation needs; the checkpoint lists them with `state: null`.
 * - `exported`: session state goes through the export / restore / retire hooks.
 */
export const CheckpointModeSchema = z.enum(["restart_only", "stateless", "exported"]);
export type CheckpointMode = z.infer<typeof CheckpointModeSchema>;

/** `wait` (default): a `/verify` in flight holds up prepare. `replay`: it may run again after a crash. */
export const CheckpointVerifySchema = z.enum(["wait", "replay"]);
export type CheckpointVerify = z.infer<typeof CheckpointVerifySchema>;

/** Seed-reply headers (protocol §5.2): the caller learns the modes without an extra request. */
export const HEADER_CHECKPOINT_VERIFY = "x-ng-checkpoint-verify";
export const HEADER_CHECKPOINT_RESTART = "x-ng-checkpoint-restart";

/** The session cookie the SDK issues on `/seed_session` and reads on every request. */
export const SESSION_COOKIE = "ng_session";

/** The routes whose success defines a session's lifecycle. */
export const ROUTE_SEED = "/seed_session";
export const ROUTE_VERIFY = "/verify";
export const ROUTE_CLOSE = "/close_session";
