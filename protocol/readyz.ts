import { z } from "zod";
import { ErrorReplySchema } from "./errors.js";

/**
 * The coordinator that answered a `/readyz`: behind a load balancer in front of several, a client
 * watching an op tells the one that took it (its refusal ends the op's wait) from a standby (whose
 * refusal says nothing about the op).
 */
const answeredBy = {
  coordinator_id: z.string().min(1),
};

/** `/readyz` 200: this coordinator is the ready leader, in term `epoch`. */
export const ReadyzReadySchema = z
  .object({ ok: z.literal(true), ...answeredBy, epoch: z.number().int().nonnegative() })
  .strict();
export type ReadyzReady = z.infer<typeof ReadyzReadySchema>;

/** `/readyz` 503: the catalog refusal (`not_leader`), naming who refused and the term it holds (null: none). */
export const ReadyzRefusalSchema = z
  .object({ error: ErrorReplySchema.shape.error, ...answeredBy, epoch: z.number().int().nonnegative().nullable() })
  .strict();
export type ReadyzRefusal = z.infer<typeof ReadyzRefusalSchema>;
