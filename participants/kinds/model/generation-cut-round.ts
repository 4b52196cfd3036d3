import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import { context, propagation } from "@opentelemetry/api";
import { captureKey } from "../../../protocol/index.js";
import type { AdmissionTicket } from "./admission-ticket.js";
import {
  GENERATION_CUT_PATH,
  MAX_CONTINUATION_HEADER_BYTES,
  buildInventory,
  continuationHeader,
  validateReceipt,
  type DurablePrefixAck,
  type GenerationCutContinuation,
  type GenerationCutRecord,
} from "./generation-cut-contract.js";

/** Where and how cut requests go. The root is the backend's base URL without a trailing `/v1`. */
export interface CutBackend {
  root: string;
  token: string;
  timeoutMs: number;
  serverName: string;
}

export interface CutRoundResult {
  /** Durable-prefix acks by ticket id. */
  acks: Map<string, DurablePrefixAck>;
  failed: number;
  /**
   * The backend's `durable_failure` acks by reason (cut to 200 characters; "no reason given"), for
   * the log: those calls are regenerated after a restore. Absent when the round failed whole (`error`).
   */
  refusals?: ReadonlyMap<string, number>;
  error: string | null;
}

/** The backend root for cut requests: the OpenAI base URL with any trailing `/v1` removed. */
export function backendRoot(baseUrl: string): string {
  return baseUrl.replace(/\/+$/, "").replace(/\/v1$/, "");
}

/**
 * One cut round: send the inventory, validate the receipt (exact echo, one ack per ticket,
 * identities match). Any failure — timeout, HTTP error, bad receipt — turns every call of the
 * inventory into a durable failure. Never throws: cuts only preserve work.
 */
export async function runCutRound(backend: CutBackend, checkpointId: string, tickets: AdmissionTicket[]): Promise<CutRoundResult> {
  const inventory = buildInventory(
    checkpointId,
    backend.serverName,
    tickets.map((t) => ({ ticket_id: t.ticketId, rollout_id: t.episode.rollout_id, attempt: t.episode.attempt, model_call_id: t.modelCallId, admitted_at: t.admittedAt })),
  );
  try {
    const raw = await postJson(`${backend.root}${GENERATION_CUT_PATH}`, inventory, backend.token, backend.timeoutMs);
    const receipt = validateReceipt(inventory, raw);
    const acks = new Map<string, DurablePrefixAck>();
    const refusals = new Map<string, number>();
    let failed = 0;
    for (const ack of receipt.prefixes) {
      if (ack.disposition === "durable_prefix") {
        acks.set(ack.ticket_id, ack);
        continue;
      }
      failed += 1;
      const reason = ack.reason?.slice(0, 200) ?? "no reason given";
      refusals.set(reason, (refusals.get(reason) ?? 0) + 1);
    }
    return { acks, failed, refusals, error: null };
  } catch (error) {
    return { acks: new Map(), failed: tickets.length, error: error instanceof Error ? error.message : String(error) };
  }
}

/** The record of a durable-prefix ack: the cut call, its conversation digest, and the continuation. */
export function cutRecordOf(ticket: AdmissionTicket, ack: DurablePrefixAck): GenerationCutRecord {
  const continuation: GenerationCutContinuation = {
    source_capture_key: captureKey(ticket.episode),
    source_model_call_id: ticket.modelCallId,
    staging_keys: ack.staging_keys,
    prefix_token_count: ack.prefix_token_count,
    prefix_digest: ack.prefix_digest,
    effective_output_limit: ack.effective_output_limit,
    terminal_finish_reason: ack.terminal_finish_reason ?? null,
    terminal_stop_reason: ack.terminal_stop_reason ?? null,
  };
  // Its header must reach the backend: one past the limit would fail every re-issue of the call.
  const header = continuationHeader(continuation).length;
  if (header > MAX_CONTINUATION_HEADER_BYTES) throw new Error(`its x-ng-continuation header would be ${header} bytes, over ${MAX_CONTINUATION_HEADER_BYTES} (${ack.staging_keys.length} staging keys)`);
  return { model_call_id: ticket.modelCallId, request_digest: ticket.requestDigest, continuation };
}

/** POST with a hard deadline on a fresh connection (control traffic never queues behind data). */
function postJson(url: string, body: unknown, token: string, timeoutMs: number): Promise<unknown> {
  const target = new URL(url);
  const payload = Buffer.from(JSON.stringify(body));
  const send = target.protocol === "https:" ? httpsRequest : httpRequest;
  const headers: Record<string, string | number> = { "content-type": "application/json", "content-length": payload.length, authorization: `Bearer ${token}` };
  // The round is part of the checkpoint's trace (the prepare's span). Added here: Node 20 announces
  // a node:http request on its diagnostics channel only once the headers are sent.
  propagation.inject(context.active(), headers);
  return new Promise((resolve, reject) => {
    const req = send(
      target,
      {
        method: "POST",
        agent: false,
        headers,
        signal: AbortSignal.timeout(timeoutMs),
      },
      (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on("data", (chunk: Buffer) => {
          size += chunk.length;
          if (size > 64 * 1024 * 1024) req.destroy(new Error("cut receipt too large"));
          else chunks.push(chunk);
        });
        res.on("end", () => {
          if (!res.statusCode || res.statusCode < 200 || res.statusCode >= 300) return reject(new Error(`generation-cut answered HTTP ${res.statusCode}`));
          try {
            resolve(JSON.parse(Buffer.concat(chunks).toString("utf8")));
          } catch {
            reject(new Error("generation-cut receipt is not JSON"));
          }
        });
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(payload);
  });
}
