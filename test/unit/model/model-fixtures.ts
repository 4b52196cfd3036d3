import { closeSync, writeSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Logger } from "pino";
import type { EpisodeId } from "../../../protocol/index.js";
import {
  ModelKind,
  conversationDigest,
  type AdmissionTicket,
  type CutBackend,
  type CutRoundResult,
  type DurablePrefixAck,
  type GenerationCutRecord,
  type LedgerRow,
  type ModelKindOptions,
  type ModelRecord,
} from "../../../participants/kinds/model/index.js";

/** A ModelKind on a temp ledger dir with a fake participant context and a scripted cut runner. */
export interface ModelFixture {
  kind: ModelKind;
  dir: string;
  retired: Set<string>;
  notified: () => number;
  /** Inventories the fake cut runner received (ticket ids per round). */
  rounds: string[][];
  /** The backend (with the round's timeout) each round was sent to. */
  backends: CutBackend[];
  /** What the next cut round answers; default: a durable prefix for every ticket. */
  answer: (tickets: AdmissionTicket[]) => CutRoundResult;
  close(): Promise<void>;
}

export const BACKEND: CutBackend = { root: "http://backend.invalid", token: "t", timeoutMs: 1000, serverName: "policy_model" };

export function ackFor(ticket: AdmissionTicket, extra: Partial<DurablePrefixAck> = {}): DurablePrefixAck {
  return {
    ticket_id: ticket.ticketId,
    rollout_id: ticket.episode.rollout_id,
    attempt: ticket.episode.attempt,
    model_call_id: ticket.modelCallId,
    admitted_at: ticket.admittedAt,
    disposition: "durable_prefix",
    cut_kind: "active_prefix",
    frozen_buffer_id: `buf-${ticket.ticketId}`,
    staging_keys: [`cut/${ticket.modelCallId}`],
    prefix_token_count: 7,
    prefix_digest: "a".repeat(64),
    effective_output_limit: 100,
    ...extra,
  };
}

export const ackAll = (tickets: AdmissionTicket[]): CutRoundResult => ({ acks: new Map(tickets.map((t) => [t.ticketId, ackFor(t)])), failed: 0, error: null });

export async function modelFixture(options: { cuts?: boolean; stripes?: number; logger?: Logger; ledger?: Pick<ModelKindOptions, "ledgerWrite" | "ledgerSync" | "ledgerProbeIntervalMs"> } = {}): Promise<ModelFixture> {
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-model-unit-"));
  const retired = new Set<string>();
  let notifications = 0;
  const fixture: ModelFixture = {
    kind: undefined as unknown as ModelKind,
    dir,
    retired,
    notified: () => notifications,
    rounds: [],
    backends: [],
    answer: ackAll,
    async close() {
      await fixture.kind.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
  fixture.kind = new ModelKind({
    ledgerDir: join(dir, "ledger"),
    ...(options.stripes !== undefined && { ledgerStripes: options.stripes }),
    cutBackend: options.cuts === false ? null : BACKEND,
    ...(options.logger && { logger: options.logger }),
    ...options.ledger,
    cutRunner: async (backend, _checkpointId, tickets) => {
      fixture.rounds.push(tickets.map((t) => t.ticketId));
      fixture.backends.push(backend);
      return fixture.answer(tickets);
    },
  });
  fixture.kind.attach({
    notifyReadinessChanged: () => void (notifications += 1),
    isRetired: (episode: EpisodeId) => retired.has(`${episode.rollout_id}#${episode.attempt}`),
  });
  return fixture;
}

export const chat = (content: string, extra: Record<string, unknown> = {}) => ({ model: "policy", messages: [{ role: "user", content }], ...extra });
export const CHAT = "/v1/chat/completions";

/** A first-call chat lineage row of `capture_key` with nothing staged, as a ledger appends it. */
export const ledgerRow = (capture_key: string, model_call_id: string): LedgerRow => ({
  capture_key,
  model_call_id,
  parent_call_id: null,
  continued_from: null,
  route: CHAT,
  staging_key: null,
  usage: null,
  recorded_at: 1,
});

/** What a commit exports for episodes with no delivered call and no cut: an empty record each. */
export const emptyRecords = (...episodes: EpisodeId[]): ModelRecord[] => episodes.map((episode_id) => ({ episode_id, rows: [], generation_cuts: [] }));

/** A generation cut of `sourceKey`'s call "mc-cut", as exported, that a retry sending the chat `request` consumes. */
export function cutRecord(sourceKey: string, request: Parameters<typeof conversationDigest>[1], extra: Partial<GenerationCutRecord["continuation"]> = {}): GenerationCutRecord {
  return {
    model_call_id: "mc-cut",
    request_digest: conversationDigest(CHAT, request),
    continuation: {
      source_capture_key: sourceKey,
      source_model_call_id: "mc-cut",
      staging_keys: ["cut/mc-cut"],
      prefix_token_count: 9,
      prefix_digest: "c".repeat(64),
      effective_output_limit: 50,
      terminal_finish_reason: null,
      terminal_stop_reason: null,
      ...extra,
    },
  };
}

/** Admits, starts and completes one call; returns its ticket. */
export async function deliveredCall(kind: ModelKind, key: string, content = "hi", stagingKey: string | null = null): Promise<AdmissionTicket> {
  const ticket = await kind.admit(key, CHAT, chat(content));
  await kind.responseStart(ticket);
  await kind.complete(ticket, { stagingKey, usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });
  return ticket;
}

/** Resolves on the next microtask turns, so a pending promise can be observed as still pending. */
export async function settle(turns = 20): Promise<void> {
  for (let i = 0; i < turns; i++) await new Promise((resolve) => setImmediate(resolve));
}

export function isPending(promise: Promise<unknown>): () => boolean {
  let done = false;
  promise.then(
    () => (done = true),
    () => (done = true),
  );
  return () => !done;
}

/**
 * A capture-ledger `write` whose next write, once armed, is torn: everything but the newline reaches
 * the file, then it fails (EIO) with its descriptor gone, so the cut-off (ftruncate through it) fails
 * too and the key is marked for repair. Other writes go through.
 */
export function tornWrites(): { write: (fd: number, buffer: Buffer, offset: number) => number; tearNext: () => void } {
  let tear = false;
  return {
    tearNext: () => void (tear = true),
    write: (fd, buffer, offset) => {
      if (!tear) return writeSync(fd, buffer, offset);
      tear = false;
      writeSync(fd, buffer.subarray(offset, buffer.length - 1));
      closeSync(fd);
      throw Object.assign(new Error("EIO: i/o error, write"), { code: "EIO" });
    },
  };
}
