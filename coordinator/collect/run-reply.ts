import { z } from "zod";
import { describeZodError, keepingProtoKey } from "../../protocol/index.js";

/**
 * The largest `/run` reply body the collector reads by default (the attempt fails `payload_too_large`
 * past it, the rest cancelled): a reply may carry the whole trajectory, tens of MiB, but an environment
 * answering with an endless body must not grow the collector without bound.
 */
export const MAX_RUN_REPLY_BYTES = 64 * 1024 * 1024;

/**
 * The most `--max-run-reply-mib` raises it to: a trajectory of screenshots or huge tool outputs can
 * outgrow 64 MiB, and every attempt of its row would fail alike. Half the longest string: the reply
 * is decoded as one, and its results.jsonl line (written again as JSON, the row's fields beside it)
 * must stay a line every reader decodes.
 */
export const MAX_RUN_REPLY_MIB_LIMIT = 256;

const Count = z.number().int().min(0);

/**
 * The part of an environment's `/run` reply the collector uses. Environments add fields of their own
 * (answers, verdicts, metrics), which results.jsonl keeps verbatim, so unknown fields pass; the
 * reward and the usage counters are checked, so a malformed reply fails its attempt instead of
 * being recorded as reward 0. A field named `__proto__` is kept too (keepingProtoKey): zod leaves it
 * out of a passthrough object.
 */
export const RunReplySchema = keepingProtoKey(
  z
    .object({
      reward: z.number().finite(),
      usage: keepingProtoKey(
        z.object({ model_calls_kept: Count.optional(), tokens_kept: Count.optional(), model_calls_regenerated: Count.optional(), tokens_regenerated: Count.optional() }).passthrough(),
      ).optional(),
      trajectory: z.unknown().optional(),
    })
    .passthrough(),
);

export type RunReply = z.infer<typeof RunReplySchema>;

/** The reply of a 2xx `/run`, or an Error naming what is wrong with it. */
export function parseRunReply(body: unknown): RunReply | Error {
  const parsed = RunReplySchema.safeParse(body);
  return parsed.success ? parsed.data : new Error(`/run answered 2xx with an invalid reply: ${describeZodError(parsed.error)}`);
}
