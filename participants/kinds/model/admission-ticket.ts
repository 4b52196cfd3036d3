import type { EpisodeId } from "../../../protocol/index.js";
import type { DurablePrefixAck, GenerationCutContinuation, GenerationCutRecord } from "./generation-cut-contract.js";

/**
 * One admitted generation call. A ticket lives from admission until its response has left for the
 * caller in full (row written, last byte handed to the socket) or the call failed; `responseStarted`
 * separates a delivered-in-progress call (must finish sending, blocks prepare) from an undelivered
 * one (may be held, cut, and is re-issued after a restore).
 */
export interface AdmissionTicket {
  readonly ticketId: string;
  readonly captureKey: string;
  readonly episode: EpisodeId;
  readonly route: string;
  /** Epoch seconds. */
  readonly admittedAt: number;
  readonly modelCallId: string;
  readonly parentCallId: string | null;
  readonly stream: boolean;
  readonly requestDigest: string;
  /** Why the request may never be cut, or null. */
  readonly constrained: string | null;
  /** The restored cut this call consumed; handed to the backend as its continuation. */
  claimedCut: GenerationCutRecord | null;
  responseStarted: boolean;
  held: boolean;
  finished: boolean;
  /** Durable-prefix ack of the current checkpoint's cut round, if any. */
  cutAck: DurablePrefixAck | null;
  /** Aborted by retire (or shutdown): the proxy drops the upstream call. */
  readonly abort: AbortController;
  /** Resolves when the ticket is closed (finished or failed). */
  readonly closed: Promise<void>;
}

export function continuationOf(ticket: AdmissionTicket): GenerationCutContinuation | null {
  return ticket.claimedCut?.continuation ?? null;
}
