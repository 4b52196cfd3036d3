import { createHash, type Hash } from "node:crypto";

/**
 * What the reference backend records and what tests script: the call log, a hold that keeps
 * calls beyond the Nth from starting their response, a gate that pauses streams mid-generation,
 * and the cut behaviour (ack, failure acks, HTTP error, a tampered echo, or no answer).
 */
export interface BackendCall {
  seq: number;
  capture_key: string | null;
  model_call_id: string | null;
  parent_call_id: string | null;
  message_count: number;
  stream: boolean;
  continued_from: string | null;
  /** Tokens of the staged prefix the continuation resumed after (0 when not continued). */
  continued_prefix_tokens: number;
  /** The response was fully written to the caller. */
  delivered: boolean;
  /** The caller went away before the response was fully written. */
  aborted: boolean;
  /** Content tokens produced so far. */
  tokens_emitted: number;
  /** Set once the policy produced every token. */
  finished: boolean;
  cut_ids: string[];
}

/**
 * The call log keeps the latest DEFAULT_CALL_LOG_LIMIT calls: when it is full the oldest tenth is
 * dropped (a cut naming a dropped call acks it `durable_failure`, "unknown call"). The cut log and
 * the duplicate-cut receipts keep the latest DEFAULT_RECEIPT_LIMIT (a duplicate of an older cut is
 * cut afresh).
 */
export const DEFAULT_CALL_LOG_LIMIT = 100_000;
export const DEFAULT_RECEIPT_LIMIT = 1_000;
/** The prefix digest covers the emitted text up to this many characters (whole tokens). */
const EMITTED_DIGEST_CHARS = 1_000_000;

/** Drops the oldest entries of a full log: a tenth of it at a time, so a steady stream of calls does not copy the log on every call. */
export function trimOldest<T>(log: T[], limit: number): number {
  if (log.length < limit) return 0;
  const drop = log.length - limit + Math.max(1, Math.floor(limit / 10));
  log.splice(0, drop);
  return drop;
}

export const CUT_MODES = ["ack", "failure", "error", "bad_echo", "hang"] as const;
export type CutMode = (typeof CUT_MODES)[number];

export interface CutLogEntry {
  cut_id: string;
  checkpoint_id: string;
  model_call_ids: string[];
  dispositions: string[];
}

class Latch {
  private waiting: Promise<void> | undefined;
  private open: (() => void) | undefined;
  arm(): void {
    if (this.waiting) return;
    this.waiting = new Promise((resolve) => (this.open = resolve));
  }
  release(): void {
    this.open?.();
    this.waiting = undefined;
    this.open = undefined;
  }
  get armed(): boolean {
    return this.waiting !== undefined;
  }
  async pass(): Promise<void> {
    if (this.waiting) await this.waiting;
  }
}

export interface BackendLimits {
  /** How many calls the log keeps (DEFAULT_CALL_LOG_LIMIT). */
  callLogLimit?: number;
  /** How many cut log entries and receipts are kept (DEFAULT_RECEIPT_LIMIT). */
  receiptLimit?: number;
}

export class BackendControls {
  calls: BackendCall[] = [];
  /** Calls the log dropped, oldest first. */
  callsDropped = 0;
  readonly callLogLimit: number;
  readonly receiptLimit: number;
  private lastSeq = 0;
  /** The running digest of each call's emitted text (no copy of the text is kept). */
  private readonly emitted = new WeakMap<BackendCall, { hash: Hash; chars: number }>();
  cuts: CutLogEntry[] = [];
  cutMode: CutMode = "ack";
  /** Calls with seq > holdAfter wait before their response starts. */
  holdAfter: number | null = null;
  private readonly hold = new Latch();
  /** Streams pause after this many chunks while the gate is closed. */
  gateAfterChunks: number | null = null;
  private readonly gate = new Latch();
  private readonly cutHang = new Latch();

  constructor(limits: BackendLimits = {}) {
    this.callLogLimit = Math.max(1, limits.callLogLimit ?? DEFAULT_CALL_LOG_LIMIT);
    this.receiptLimit = Math.max(1, limits.receiptLimit ?? DEFAULT_RECEIPT_LIMIT);
  }

  record(call: Omit<BackendCall, "seq" | "delivered" | "aborted" | "tokens_emitted" | "finished" | "cut_ids">): BackendCall {
    this.callsDropped += trimOldest(this.calls, this.callLogLimit);
    this.lastSeq += 1;
    const entry: BackendCall = { ...call, seq: this.lastSeq, delivered: false, aborted: false, tokens_emitted: 0, finished: false, cut_ids: [] };
    this.calls.push(entry);
    this.emitted.set(entry, { hash: createHash("sha256"), chars: 0 });
    return entry;
  }

  /** Counts a produced token and adds it to the call's prefix digest (up to EMITTED_DIGEST_CHARS). */
  emit(call: BackendCall, token: string): void {
    call.tokens_emitted += 1;
    const text = this.emitted.get(call);
    if (!text || text.chars >= EMITTED_DIGEST_CHARS) return;
    text.hash.update(token, "utf8");
    text.chars += token.length;
  }

  /** sha256 hex of the call's emitted text so far. */
  prefixDigest(call: BackendCall): string {
    const text = this.emitted.get(call);
    return (text ? text.hash.copy() : createHash("sha256")).digest("hex");
  }

  /** Logs a cut, keeping the latest receiptLimit entries. */
  logCut(entry: CutLogEntry): void {
    trimOldest(this.cuts, this.receiptLimit);
    this.cuts.push(entry);
  }

  /**
   * Holds calls beyond the Nth. Without N, every call not recorded yet: a count the caller read
   * first lets calls recorded before the hold lands slip past it unseen.
   */
  setHold(after: number = this.lastSeq): number {
    this.holdAfter = after;
    this.hold.arm();
    return after;
  }

  /** Waits while this call is beyond the hold. */
  async passHold(call: BackendCall): Promise<void> {
    if (this.holdAfter !== null && call.seq > this.holdAfter) await this.hold.pass();
  }

  releaseHold(): void {
    this.holdAfter = null;
    this.hold.release();
  }

  setGate(afterChunks: number): void {
    this.gateAfterChunks = afterChunks;
    this.gate.arm();
  }

  async passGate(chunkIndex: number): Promise<void> {
    if (this.gateAfterChunks !== null && chunkIndex >= this.gateAfterChunks) await this.gate.pass();
  }

  openGate(): void {
    this.gateAfterChunks = null;
    this.gate.release();
  }

  setCutMode(mode: CutMode): void {
    this.cutMode = mode;
    if (mode === "hang") this.cutHang.arm();
    else this.cutHang.release();
  }

  async passCutHang(): Promise<void> {
    await this.cutHang.pass();
  }

  reset(): void {
    this.releaseHold();
    this.openGate();
    this.setCutMode("ack");
    this.calls = [];
    this.callsDropped = 0;
    this.lastSeq = 0;
    this.cuts = [];
  }

  /** The call log (copies). */
  view(): BackendCall[] {
    return this.calls.map((call) => ({ ...call, cut_ids: [...call.cut_ids] }));
  }
}
