import { z } from "zod";
import { AttemptSchema, CheckpointIdSchema, RolloutIdSchema, canonicalDigest } from "../../../protocol/index.js";

/**
 * The framework-neutral generation-cut contract between the model participant and an inference
 * backend: `POST <backend root>/ng-control/v1/generation-cut` with bearer auth. The participant
 * sends an inventory of undelivered calls; the backend freezes each call's generated prefix,
 * stages it durably, and answers with one ack per call. The receipt is the durability boundary.
 */
export const GENERATION_CUT_PATH = "/ng-control/v1/generation-cut";

const Sha256Schema = z.string().regex(/^[0-9a-f]{64}$/, "must be 64 lowercase hex digits");
const IdSchema = z.string().min(1).max(200);

export const ActivePrefixSchema = z
  .object({
    ticket_id: IdSchema,
    rollout_id: RolloutIdSchema,
    attempt: AttemptSchema,
    model_call_id: IdSchema,
    admitted_at: z.number().finite(),
  })
  .strict();
export type ActivePrefix = z.infer<typeof ActivePrefixSchema>;

export const GenerationCutInventorySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    server_name: z.string().min(1).max(128),
    active_prefixes: z.array(ActivePrefixSchema).max(100_000),
    inventory_digest: Sha256Schema,
  })
  .strict();
export type GenerationCutInventory = z.infer<typeof GenerationCutInventorySchema>;

const IdentityShape = {
  ticket_id: IdSchema,
  rollout_id: RolloutIdSchema,
  attempt: AttemptSchema,
  model_call_id: IdSchema,
  admitted_at: z.number().finite(),
};

const FinishReasonSchema = z.enum(["stop", "length"]);

export const DurablePrefixAckSchema = z
  .object({
    ...IdentityShape,
    disposition: z.literal("durable_prefix"),
    cut_kind: z.enum(["active_prefix", "terminal_completion"]),
    frozen_buffer_id: IdSchema,
    staging_keys: z
      .array(z.string().min(1).max(512))
      .min(1)
      .refine((keys) => new Set(keys).size === keys.length, "staging_keys must be unique"),
    prefix_token_count: z.number().int().min(0),
    prefix_digest: Sha256Schema,
    effective_output_limit: z.number().int().min(1),
    terminal_finish_reason: FinishReasonSchema.optional(),
    terminal_stop_reason: z.string().max(1000).optional(),
  })
  .strict()
  .refine((ack) => ack.terminal_stop_reason === undefined || ack.terminal_finish_reason !== undefined, "terminal_stop_reason requires terminal_finish_reason");

export const DurableFailureAckSchema = z
  .object({ ...IdentityShape, disposition: z.literal("durable_failure"), reason: z.string().max(1000).optional() })
  .strict();

export const GenerationCutPrefixAckSchema = z.union([DurablePrefixAckSchema, DurableFailureAckSchema]);
export type GenerationCutPrefixAck = z.infer<typeof GenerationCutPrefixAckSchema>;
export type DurablePrefixAck = z.infer<typeof DurablePrefixAckSchema>;

export const GenerationCutReceiptSchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    cut_id: IdSchema,
    inventory_digest: Sha256Schema,
    backend_snapshot_id: IdSchema,
    inventory: GenerationCutInventorySchema,
    prefixes: z.array(GenerationCutPrefixAckSchema),
  })
  .strict();
export type GenerationCutReceipt = z.infer<typeof GenerationCutReceiptSchema>;

/**
 * The longest `x-ng-continuation` header value (base64url of the continuation's JSON) a continuing
 * call carries: with the call's other headers it stays within the 16 KiB of headers common HTTP
 * servers accept (Node's, h11's). A longer one would be refused by the backend on every re-issue of
 * the call, so the episode could never continue: such a cut is not kept (the call is regenerated).
 */
export const MAX_CONTINUATION_HEADER_BYTES = 8 * 1024;

/** The `x-ng-continuation` header value of a continuation: base64url of its JSON. */
export function continuationHeader(continuation: object): string {
  return Buffer.from(JSON.stringify(continuation)).toString("base64url");
}

/** What a continuing call hands the backend so it resumes after the staged prefix. */
export const GenerationCutContinuationSchema = z
  .object({
    source_capture_key: z.string().min(1).max(220),
    source_model_call_id: IdSchema,
    staging_keys: z.array(z.string().min(1).max(512)).min(1),
    prefix_token_count: z.number().int().min(0),
    prefix_digest: Sha256Schema,
    effective_output_limit: z.number().int().min(1),
    terminal_finish_reason: FinishReasonSchema.nullable(),
    terminal_stop_reason: z.string().max(1000).nullable(),
  })
  .strict()
  .refine((continuation) => continuationHeader(continuation).length <= MAX_CONTINUATION_HEADER_BYTES, {
    message: `encodes into an x-ng-continuation header longer than ${MAX_CONTINUATION_HEADER_BYTES} bytes`,
  });
export type GenerationCutContinuation = z.infer<typeof GenerationCutContinuationSchema>;

/** One cut kept per episode: the call it cut, the conversation it answered, and the continuation. */
export const GenerationCutRecordSchema = z
  .object({
    model_call_id: IdSchema,
    request_digest: Sha256Schema,
    continuation: GenerationCutContinuationSchema,
  })
  .strict();
export type GenerationCutRecord = z.infer<typeof GenerationCutRecordSchema>;

/** sha256 of the canonical JSON of the inventory's identity (everything but the digest itself). */
export function inventoryDigest(inventory: Omit<GenerationCutInventory, "inventory_digest">): string {
  return canonicalDigest({ checkpoint_id: inventory.checkpoint_id, server_name: inventory.server_name, active_prefixes: inventory.active_prefixes });
}

export function buildInventory(checkpointId: string, serverName: string, prefixes: ActivePrefix[]): GenerationCutInventory {
  const active_prefixes = [...prefixes].sort((a, b) => (a.ticket_id < b.ticket_id ? -1 : a.ticket_id > b.ticket_id ? 1 : 0));
  const body = { checkpoint_id: checkpointId, server_name: serverName, active_prefixes };
  return { ...body, inventory_digest: inventoryDigest(body) };
}

/**
 * Validates a receipt against the inventory that was sent: the echo and digest must be identical,
 * one ack per ticket, and every ack's identity must match its ticket. Throws a readable Error.
 */
export function validateReceipt(sent: GenerationCutInventory, raw: unknown): GenerationCutReceipt {
  const parsed = GenerationCutReceiptSchema.safeParse(raw);
  if (!parsed.success) throw new Error(`malformed generation-cut receipt: ${parsed.error.issues[0]?.path.join(".")}: ${parsed.error.issues[0]?.message}`);
  const receipt = parsed.data;
  if (receipt.checkpoint_id !== sent.checkpoint_id) throw new Error("receipt names another checkpoint");
  if (receipt.inventory_digest !== sent.inventory_digest) throw new Error("receipt inventory_digest differs from the inventory sent");
  if (canonicalDigest(receipt.inventory) !== canonicalDigest(sent)) throw new Error("receipt inventory is not an exact echo of the inventory sent");
  if (receipt.prefixes.length !== sent.active_prefixes.length) throw new Error(`receipt has ${receipt.prefixes.length} acks for ${sent.active_prefixes.length} tickets`);
  const byTicket = new Map(sent.active_prefixes.map((p) => [p.ticket_id, p]));
  const seen = new Set<string>();
  for (const ack of receipt.prefixes) {
    const prefix = byTicket.get(ack.ticket_id);
    if (!prefix) throw new Error(`receipt acks unknown ticket ${ack.ticket_id}`);
    if (seen.has(ack.ticket_id)) throw new Error(`receipt acks ticket ${ack.ticket_id} twice`);
    seen.add(ack.ticket_id);
    if (ack.rollout_id !== prefix.rollout_id || ack.attempt !== prefix.attempt || ack.model_call_id !== prefix.model_call_id || ack.admitted_at !== prefix.admitted_at) {
      throw new Error(`receipt identity of ticket ${ack.ticket_id} does not match`);
    }
  }
  return receipt;
}
