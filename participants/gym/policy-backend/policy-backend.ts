import { randomUUID } from "node:crypto";
import type { ServerResponse } from "node:http";
import Fastify, { type FastifyInstance } from "fastify";
import { z } from "zod";
import { CheckpointError, bearerToken, describeZodError, tokensEqual } from "../../../protocol/index.js";
import { installRefusalHandlers, participantServerOptions } from "../../http/refusal-handlers.js";
import {
  GENERATION_CUT_PATH,
  GenerationCutContinuationSchema,
  GenerationCutInventorySchema,
  inventoryDigest,
  type GenerationCutPrefixAck,
  type GenerationCutReceipt,
} from "../../kinds/model/generation-cut-contract.js";
import { requireJsonPost } from "../admin-json-post.js";
import { BackendControls, CUT_MODES, type BackendCall } from "./backend-controls.js";
import { ChatRequestSchema, decide, type PolicyReply } from "./deterministic-policy.js";

/**
 * The reference policy backend: a fake OpenAI-compatible chat server with a deterministic policy,
 * a call log, scriptable holds/gates, and the generation-cut endpoint. It is NOT a participant;
 * the attach proxy in front of it is.
 *
 * Headers it reads: x-ng-capture-key, x-ng-model-call-id, x-ng-parent-call-id, x-ng-continued-from,
 * x-ng-continuation (base64url JSON GenerationCutContinuation). It answers with
 * `x-ng-staging-key: stage/<model_call_id>` — where a real framework would stage the tokens.
 */
export interface PolicyBackendOptions {
  /** Pause between streamed chunks. */
  tokenDelayMs?: number;
  /** Bearer token of the generation-cut endpoint. */
  cutToken: string;
  /** Calls the log keeps (DEFAULT_CALL_LOG_LIMIT). */
  callLogLimit?: number;
  /** Cut log entries and duplicate-cut receipts kept (DEFAULT_RECEIPT_LIMIT). */
  receiptLimit?: number;
  logger?: boolean;
  /**
   * Answer as a reasoning model: every reply carries a short deterministic thought under this field
   * (`reasoning_content`, or newer vLLM's `reasoning`), a delta of its own before a stream's content.
   * It is not counted in the tokens a cut's prefix covers. None by default.
   */
  reasoning?: ReasoningField;
}

export const REASONING_FIELDS = ["reasoning_content", "reasoning"] as const;
export type ReasoningField = (typeof REASONING_FIELDS)[number];

/** The thought a reasoning reply carries: what the decision is, so tests can tell turns apart. */
function thoughtOf(decision: PolicyReply): string {
  return decision.type === "tool_call" ? `Call ${decision.name} with ${decision.arguments}.` : `Answer ${decision.tokens.join("").slice(0, 200)}.`;
}

/** `after` omitted: hold every call not recorded yet. */
const HoldSchema = z.object({ after: z.number().int().min(0).optional() }).strict();
const GateSchema = z.object({ after_chunks: z.number().int().min(0).default(1) }).strict();
const CutModeSchema = z.object({ mode: z.enum(CUT_MODES) }).strict();
const EmptySchema = z.object({}).strict();
const DEFAULT_OUTPUT_LIMIT = 4096;

function parse<T>(schema: z.ZodType<T>, body: unknown): T {
  const parsed = schema.safeParse(body ?? {});
  if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
  return parsed.data;
}

function header(value: string | string[] | undefined): string | null {
  const v = Array.isArray(value) ? value[0] : value;
  return v === undefined || v === "" ? null : v;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

export async function createPolicyBackend(options: PolicyBackendOptions): Promise<{ app: FastifyInstance; controls: BackendControls }> {
  const controls = new BackendControls({
    ...(options.callLogLimit !== undefined && { callLogLimit: options.callLogLimit }),
    ...(options.receiptLimit !== undefined && { receiptLimit: options.receiptLimit }),
  });
  const app = Fastify({ logger: options.logger ?? false, bodyLimit: 32 * 1024 * 1024, ...participantServerOptions(null) });
  const delay = options.tokenDelayMs ?? 0;
  const receipts = new Map<string, GenerationCutReceipt>();

  installRefusalHandlers(app, "policy backend", null);

  app.get("/health", async () => ({ ok: true }));
  app.get("/v1/models", async () => ({ object: "list", data: [{ id: "policy", object: "model", created: 0, owned_by: "gym-ckpt" }] }));

  app.post("/v1/chat/completions", async (request, reply) => {
    const body = parse(ChatRequestSchema, request.body);
    const continuationRaw = header(request.headers["x-ng-continuation"]);
    let continuedPrefixTokens = 0;
    if (continuationRaw) {
      const decoded = GenerationCutContinuationSchema.safeParse(safeJson(Buffer.from(continuationRaw, "base64url").toString("utf8")));
      if (!decoded.success) throw new CheckpointError("invalid_request", `x-ng-continuation: ${describeZodError(decoded.error)}`);
      continuedPrefixTokens = decoded.data.prefix_token_count;
    }
    const call = controls.record({
      capture_key: header(request.headers["x-ng-capture-key"]),
      model_call_id: header(request.headers["x-ng-model-call-id"]),
      parent_call_id: header(request.headers["x-ng-parent-call-id"]),
      message_count: body.messages.length,
      stream: body.stream === true,
      continued_from: header(request.headers["x-ng-continued-from"]),
      continued_prefix_tokens: continuedPrefixTokens,
    });
    const raw = reply.raw;
    raw.once("close", () => {
      if (!raw.writableFinished) call.aborted = true;
    });
    await controls.passHold(call);
    const decision = decide(body);
    if (raw.destroyed) {
      call.aborted = true;
      return reply.hijack();
    }
    const staging = `stage/${call.model_call_id ?? `seq-${call.seq}`}`;
    if (!call.stream) {
      for (const token of decision.tokens) controls.emit(call, token);
      call.finished = true;
      raw.once("finish", () => (call.delivered = true));
      return reply.header("x-ng-staging-key", staging).send(completionBody(call, body.model, decision, options.reasoning));
    }
    reply.hijack();
    await streamCompletion(raw, call, body.model, decision, staging, controls, delay, options.reasoning);
  });

  app.get("/admin/calls", async () => ({ calls: controls.view(), calls_dropped: controls.callsDropped, cuts: controls.cuts.length }));
  app.get("/admin/cuts", async () => ({ cuts: controls.cuts }));
  // The state-changing admin routes take a JSON POST only (see requireJsonPost): unauthenticated, they
  // must not be reachable from a web page (a hold stalls every policy call).
  app.addHook("preValidation", async (request) => {
    if (request.routeOptions.url?.startsWith("/admin/") && request.method !== "GET" && request.method !== "HEAD") requireJsonPost(request);
  });
  app.post("/admin/hold", async (request) => {
    return { hold_after: controls.setHold(parse(HoldSchema, request.body).after) };
  });
  app.post("/admin/release", async (request) => {
    parse(EmptySchema, request.body);
    controls.releaseHold();
    return { hold_after: null };
  });
  app.post("/admin/gate", async (request) => {
    controls.setGate(parse(GateSchema, request.body).after_chunks);
    return { gate_after_chunks: controls.gateAfterChunks };
  });
  app.post("/admin/ungate", async (request) => {
    parse(EmptySchema, request.body);
    controls.openGate();
    return { gate_after_chunks: null };
  });
  app.post("/admin/cut-mode", async (request) => {
    controls.setCutMode(parse(CutModeSchema, request.body).mode);
    return { mode: controls.cutMode };
  });
  app.post("/admin/reset", async (request) => {
    parse(EmptySchema, request.body);
    controls.reset();
    receipts.clear();
    return { reset: true };
  });

  app.post(GENERATION_CUT_PATH, async (request, reply) => {
    const token = bearerToken(request.headers.authorization);
    if (token === undefined || !tokensEqual(token, options.cutToken)) throw new CheckpointError("unauthorized", "bad or missing bearer token");
    const inventory = parse(GenerationCutInventorySchema, request.body);
    if (inventoryDigest(inventory) !== inventory.inventory_digest) throw new CheckpointError("invalid_request", "inventory_digest does not match the inventory");
    // A duplicate cut request gets the same receipt: the first cut froze the prefixes.
    const earlier = receipts.get(inventory.inventory_digest);
    if (earlier) return earlier;
    const mode = controls.cutMode;
    if (mode === "hang") await controls.passCutHang();
    if (mode === "error") return reply.code(500).send({ error: { code: "internal_error", detail: "scripted cut failure" } });
    const cut_id = `cut-${randomUUID()}`;
    const prefixes: GenerationCutPrefixAck[] = inventory.active_prefixes.map((prefix, index) => {
      const identity = { ticket_id: prefix.ticket_id, rollout_id: prefix.rollout_id, attempt: prefix.attempt, model_call_id: prefix.model_call_id, admitted_at: prefix.admitted_at };
      const key = prefix.attempt === 0 ? prefix.rollout_id : `${prefix.rollout_id}-a${prefix.attempt}`;
      const call = controls.calls.find((c) => c.model_call_id === prefix.model_call_id && c.capture_key === key);
      // Every call of the inventory is undelivered to its caller, whatever `delivered` says here: that
      // only means its answer was written to the model proxy's connection, and the proxy holds an
      // answer that arrives while admission is closed. Its whole completion is cut (terminal_completion).
      if (mode === "failure" || !call) return { ...identity, disposition: "durable_failure" as const, reason: call ? "scripted cut failure" : "unknown call" };
      call.cut_ids.push(cut_id);
      return {
        ...identity,
        disposition: "durable_prefix" as const,
        cut_kind: call.finished ? ("terminal_completion" as const) : ("active_prefix" as const),
        frozen_buffer_id: `${cut_id}/buf-${index}`,
        staging_keys: [`${cut_id}/${prefix.model_call_id}`],
        prefix_token_count: call.tokens_emitted,
        prefix_digest: controls.prefixDigest(call),
        effective_output_limit: Math.max(1, DEFAULT_OUTPUT_LIMIT - call.tokens_emitted),
        ...(call.finished && { terminal_finish_reason: "stop" as const }),
      };
    });
    controls.logCut({
      cut_id,
      checkpoint_id: inventory.checkpoint_id,
      model_call_ids: inventory.active_prefixes.map((p) => p.model_call_id),
      dispositions: prefixes.map((p) => p.disposition),
    });
    const echo = mode === "bad_echo" ? { ...inventory, server_name: `${inventory.server_name}-tampered` } : inventory;
    const receipt: GenerationCutReceipt = {
      checkpoint_id: inventory.checkpoint_id,
      cut_id,
      inventory_digest: inventory.inventory_digest,
      backend_snapshot_id: `snap-${cut_id}`,
      inventory: echo,
      prefixes,
    };
    if (mode === "ack") {
      // The latest receiptLimit receipts (Map order is insertion order).
      for (const digest of receipts.keys()) {
        if (receipts.size < controls.receiptLimit) break;
        receipts.delete(digest);
      }
      receipts.set(inventory.inventory_digest, receipt);
    }
    return receipt;
  });

  return { app, controls };
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

function usage(call: BackendCall, decision: PolicyReply) {
  const prompt = call.message_count * 10;
  return { prompt_tokens: prompt, completion_tokens: decision.tokens.length, total_tokens: prompt + decision.tokens.length };
}

function completionBody(call: BackendCall, model: string | undefined, decision: PolicyReply, reasoning: ReasoningField | undefined) {
  const thought = reasoning && { [reasoning]: thoughtOf(decision) };
  const message =
    decision.type === "tool_call"
      ? { role: "assistant", content: null, ...thought, tool_calls: [{ id: `call_${call.seq}`, type: "function", function: { name: decision.name, arguments: decision.arguments } }] }
      : { role: "assistant", content: decision.content, ...thought };
  return {
    id: `chatcmpl-${call.seq}`,
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model: model ?? "policy",
    choices: [{ index: 0, message, finish_reason: decision.type === "tool_call" ? "tool_calls" : "stop", logprobs: null }],
    usage: usage(call, decision),
  };
}

/** Writes SSE chunks, honouring backpressure, the per-token delay and the gate. */
async function streamCompletion(
  raw: ServerResponse,
  call: BackendCall,
  model: string | undefined,
  decision: PolicyReply,
  staging: string,
  controls: BackendControls,
  delay: number,
  reasoning: ReasoningField | undefined,
): Promise<void> {
  raw.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive", "x-ng-staging-key": staging });
  const base = { id: `chatcmpl-${call.seq}`, object: "chat.completion.chunk", created: Math.floor(Date.now() / 1000), model: model ?? "policy" };
  const write = async (payload: string): Promise<boolean> => {
    if (raw.destroyed) return false;
    if (!raw.write(`data: ${payload}\n\n`)) await new Promise<void>((resolve) => raw.once("drain", resolve).once("close", resolve));
    return !raw.destroyed;
  };
  const chunk = (delta: object, finish: string | null, extra: object = {}) => JSON.stringify({ ...base, choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }], ...extra });
  if (!(await write(chunk({ role: "assistant", content: decision.type === "answer" ? "" : null }, null)))) return void (call.aborted = true);
  if (reasoning && !(await write(chunk({ [reasoning]: thoughtOf(decision) }, null)))) return void (call.aborted = true);
  if (decision.type === "tool_call") {
    if (!(await write(chunk({ tool_calls: [{ index: 0, id: `call_${call.seq}`, type: "function", function: { name: decision.name, arguments: "" } }] }, null)))) return void (call.aborted = true);
  }
  // Tokens leave at a steady rate, like an inference server's decode steps: token i is due i+1
  // delays after the stream started, so a late timer does not push back every later token (a
  // stream held at a gate starts a fresh schedule instead of bursting).
  let due = performance.now();
  for (let i = 0; i < decision.tokens.length; i++) {
    await controls.passGate(i);
    if (delay > 0) {
      const now = performance.now();
      due = (now > due + delay ? now : due) + delay;
      await sleep(Math.max(0, due - now));
    }
    const token = decision.tokens[i]!;
    controls.emit(call, token);
    const delta = decision.type === "tool_call" ? { tool_calls: [{ index: 0, function: { arguments: token } }] } : { content: token };
    if (!(await write(chunk(delta, null)))) return void (call.aborted = true);
  }
  call.finished = true;
  if (!(await write(chunk({}, decision.type === "tool_call" ? "tool_calls" : "stop", { usage: usage(call, decision) })))) return void (call.aborted = true);
  if (!(await write("[DONE]"))) return void (call.aborted = true);
  raw.once("finish", () => (call.delivered = !call.aborted));
  raw.end();
}
