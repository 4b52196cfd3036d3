import { z } from "zod";
import { JsonValueSchema, canonicalDigest } from "../../protocol/index.js";
import { CohortTable, DEFAULT_COHORT_SETTINGS, type CohortJudge, type CohortMember, type CohortSettings } from "./cohort-table.js";
import { afterThinkBlock, type JudgeClient } from "./judge-client.js";
import { VerifierError } from "./verifier-errors.js";
import { VerifierServer, parseVerifierBody, type VerifyResult } from "./verifier-server.js";

const CohortBodySchema = z
  .object({
    // Kept whole, an own `__proto__` key included: the judge is shown it, and it tells tasks apart.
    task: JsonValueSchema,
    answer: z.string().max(100_000),
    _ng_group_id: z.unknown(),
    _ng_group_attempt: z.unknown().optional(),
    _ng_rollout_index: z.unknown(),
  })
  .strict();

const CoordinatesSchema = z
  .object({
    groupId: z.string().min(1).max(200).regex(/^[A-Za-z0-9][A-Za-z0-9._:-]*$/),
    attempt: z.number().int().min(0).max(1_000_000),
    index: z.number().int().min(0),
  })
  .strict();

/**
 * Cohort comparison: every member of a group calls `/verify` on its own; the group is judged
 * once every member arrived, and all rewards are published together. Caller fields:
 * `_ng_group_id` (required, unique across runs), `_ng_group_attempt` (default 0) and
 * `_ng_rollout_index` (slot 0..size-1). Declared stateless + replay like the other verifiers:
 * a waiting member never holds up a checkpoint. See docs/verifiers.md for crash behaviour.
 */
export class CohortCompareVerifier extends VerifierServer {
  readonly table: CohortTable;

  constructor(settings: Partial<CohortSettings> & { size: number }, judge: CohortJudge) {
    super();
    this.table = new CohortTable({ ...DEFAULT_COHORT_SETTINGS, ...settings }, judge);
  }

  async verify(body: unknown, _request?: unknown, signal?: AbortSignal): Promise<VerifyResult> {
    const parsed = parseVerifierBody(CohortBodySchema, body);
    const coordinates = CoordinatesSchema.safeParse({
      groupId: parsed._ng_group_id,
      attempt: parsed._ng_group_attempt ?? 0,
      index: parsed._ng_rollout_index,
    });
    if (!coordinates.success) throw new VerifierError("invalid_coordinates", "_ng_group_id, _ng_group_attempt or _ng_rollout_index is invalid");
    // The full payload identifies a replay: anything different for an occupied slot is a conflict.
    const digest = canonicalDigest(parsed);
    return this.table.arrive(coordinates.data, digest, { index: coordinates.data.index, answer: parsed.answer, task: parsed.task }, signal);
  }
}

export const COHORT_SYSTEM_PROMPT =
  "You compare several responses to the same task. Reply with exactly `BEST: <number>` naming the best response.";

/** A judge that asks a model for the best response: reward 1 for it, 0 for the others. */
export function modelCohortJudge(client: JudgeClient): CohortJudge {
  return async (members: CohortMember[], signal: AbortSignal) => {
    const listing = members.map((m) => `[${m.index}] ${m.answer}`).join("\n");
    const reply = await client.ask(
      [
        { role: "system", content: COHORT_SYSTEM_PROMPT },
        { role: "user", content: `Task: ${JSON.stringify(members[0]?.task ?? null)}\nResponses:\n${listing}` },
      ],
      signal,
    );
    // Every `BEST: <n>` of the reply after its think block: one that names two members (a judge
    // revising itself) names none; a reasoning judge's weighing before its answer does not count.
    const named = new Set([...afterThinkBlock(reply).matchAll(/BEST:\s*(\d+)/gi)].map((match) => Number(match[1])));
    if (named.size > 1) throw new Error(`the judge named ${named.size} different responses`);
    const best = named.size === 1 ? [...named][0]! : Number.NaN;
    if (!members.some((m) => m.index === best)) throw new Error("the judge named no response");
    return members.map((m) => (m.index === best ? 1 : 0));
  };
}
