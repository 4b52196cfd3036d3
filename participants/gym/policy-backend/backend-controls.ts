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
  /** The emitted text so far (for prefix digests). */
  emitted: string;
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

export class BackendControls {
  calls: BackendCall[] = [];
  cuts: CutLogEntry[] = [];
  cutMode: CutMode = "ack";
  /** Calls with seq > holdAfter wait before their response starts. */
  holdAfter: number | null = null;
  private readonly hold = new Latch();
  /** Streams pause after this many chunks while the gate is closed. */
  gateAfterChunks: number | null = null;
  private readonly gate = new Latch();
  private readonly cutHang = new Latch();

  record(call: Omit<BackendCall, "seq" | "delivered" | "aborted" | "tokens_emitted" | "finished" | "cut_ids" | "emitted">): BackendCall {
    const entry: BackendCall = { ...call, seq: this.calls.length + 1, delivered: false, aborted: false, tokens_emitted: 0, finished: false, cut_ids: [], emitted: "" };
    this.calls.push(entry);
    return entry;
  }

  /**
   * Holds calls beyond the Nth. Without N, every call not recorded yet: a count the caller read
   * first lets calls recorded before the hold lands slip past it unseen.
   */
  setHold(after: number = this.calls.length): number {
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
    this.cuts = [];
  }

  /** The call log without the emitted text. */
  view(): Omit<BackendCall, "emitted">[] {
    return this.calls.map(({ emitted: _emitted, ...rest }) => rest);
  }
}
