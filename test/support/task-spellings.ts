import type { FastifyInstance } from "fastify";
import { expect } from "vitest";

/**
 * The restore digest of a Gym task as servers before the as-spelled digest recorded it (defaults
 * filled in) and as a caller may spell it (a default left out): every pairing must restore.
 */
const asParsed = { expression: "1+1", tool_rounds: 1 };
const asSpelled = { expression: "1+1" };
export const RECORDED_AND_SENT_SPELLINGS: [Record<string, unknown>, Record<string, unknown>][] = [
  [asParsed, asSpelled],
  [asSpelled, asParsed],
  [asSpelled, asSpelled],
  [asParsed, asParsed],
];

/**
 * Against a server holding rollout r1's restored record (boundary bogus, so a matching digest is
 * refused only afterwards): other tasks are `invalid_request`, `sent` is `invalid_checkpoint_state`
 * (its digest matched).
 */
export async function expectRestoredTaskChecks(app: FastifyInstance, sent: Record<string, unknown>): Promise<void> {
  for (const other of [{ expression: "1+2" }, { expression: "1+1", tool_rounds: 2 }, { expression: "1+1", tool_rounds: 0 }]) {
    const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 2, task: other } });
    expect([res.statusCode, res.json().error.code]).toEqual([400, "invalid_request"]);
  }
  const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 2, task: sent } });
  expect([res.statusCode, res.json().error.code]).toEqual([422, "invalid_checkpoint_state"]);
}
