import { randomUUID } from "node:crypto";
import type { Logger } from "pino";
import { CheckpointError, canonicalDigest, captureKey, nextAttempt, parseCaptureKey, type EpisodeId } from "../../../protocol/index.js";
import { currentAttemptsOnly, refuseTwoAttempts } from "../../control-plane/one-attempt-per-rollout.js";
import { retiredBy } from "../../control-plane/attempt-marks.js";
import type { CloseAdmissionOptions, KindReadiness, ParticipantContext, ParticipantKind } from "../../control-plane/participant-kind.js";
import { participantInstruments } from "../../telemetry/instruments.js";
import type { AdmissionTicket } from "./admission-ticket.js";
import { CaptureLedger, type LedgerSync, type LedgerWrite } from "./capture-ledger.js";
import { constrainedReason, conversationDigest, skipCategory } from "./conversation-digest.js";
import type { GenerationCutRecord } from "./generation-cut-contract.js";
import { cutRecordOf, runCutRound, type CutBackend, type CutRoundResult } from "./generation-cut-round.js";
import type { LedgerRow } from "./ledger-row.js";
import { LEDGER_PROBE_INTERVAL_MS, LedgerOutage } from "./ledger-outage.js";
import { MAX_MODEL_RECORD_ROWS, ModelRecordSchema, type ModelRecord } from "./model-record.js";
import { fencedAttempt } from "../../control-plane/attempt-marks.js";

export interface ModelKindOptions {
  /** Directory of the capture ledger (persists across process restarts). */
  ledgerDir: string;
  ledgerStripes?: number;
  /** The ledger's file write; a seam for tests (default: writeSync). */
  ledgerWrite?: LedgerWrite;
  /** The ledger's fdatasync of an appended row; a seam for tests (default: fdatasync in the thread pool). */
  ledgerSync?: LedgerSync;
  /** After a row's write failed in the storage, how often at most admission tries the storage again (default 1000 ms). */
  ledgerProbeIntervalMs?: number;
  /** Rows the ledger keeps in memory at most (default 50 000); older keys are read again from disk. */
  ledgerCacheRows?: number;
  /** Runs one cut round (default: POST to the backend); a seam for tests. */
  cutRunner?: typeof runCutRound;
  /** The backend's cut endpoint; null = the backend cannot cut (calls are regenerated). */
  cutBackend: CutBackend | null;
  logger?: Logger;
}

/** The largest staging-key list a commit reply carries inline (JSON bytes, as encoded). */
export const STAGING_KEYS_REPLY_BUDGET = 256 * 1024;

/** Selects calls by their episode and capture key. */
type CallSelector = (episode: EpisodeId, key: string) => boolean;

export interface CallOutcome {
  stagingKey: string | null;
  usage: LedgerRow["usage"];
}

/**
 * The policy-model participant kind: admission tickets for generation calls, responses held while
 * admission is closed, one generation-cut round per close, and the token-free capture ledger that
 * a checkpoint exports (delivered calls only) and a restore imports as the next attempt's ledger.
 */
export class ModelKind implements ParticipantKind<ModelRecord> {
  readonly kind = "model" as const;
  readonly recordSchema = ModelRecordSchema;
  /** The ledger keeps every episode ever served: a checkpoint exports only those the controller continues. */
  readonly scopeRequired = true;
  readonly ledger: CaptureLedger;
  private context: ParticipantContext | undefined;
  private checkpointIdSource: () => string | null = () => null;
  private admitting = true;
  /** Shutdown began: no new call, and no held response, is admitted any more. */
  private closing = false;
  private reopened = latch();
  readonly tickets = new Map<string, AdmissionTicket>();
  /** The model call ids of open tickets (unique per call): their rows may still be taken back. */
  private readonly openCalls = new Set<string>();
  /** Open tickets whose row is being written or written: close() lets them settle (a take-back may follow). */
  private readonly recording = new Set<AdmissionTicket>();
  private served = false;
  /** Restored cuts by NEXT-attempt capture key, consumed by a matching re-issued call. */
  private readonly restoredCuts = new Map<string, GenerationCutRecord>();
  /** Imported ledgers whose replacement has not called yet. */
  private readonly restoredKeys = new Set<string>();
  /**
   * Restored keys afterCommit is freeing; a call claiming one meanwhile takes it out (its ledger stays).
   * False once a retire or forget dropped its restored state meanwhile: a failed free does not bring it back.
   */
  private readonly freeing = new Map<string, boolean>();
  /** afterCommit's removal of each key it is freeing, from its start until it settled (never rejects). */
  private readonly removals = new Map<string, Promise<void>>();
  /** Keys with an admit() in progress, by how many: afterCommit does not free a ledger a call is reading. */
  private readonly admitsInFlight = new Map<string, number>();
  /** Each admit() past its first check, until it settled: a forget waits for those of fenced attempts. */
  private readonly admitsUnderWay = new Set<{ episode: EpisodeId; settled: Promise<void> }>();
  /** This checkpoint's cuts: one per episode, the latest admitted. */
  private readonly latestCuts = new Map<string, { admittedAt: number; record: GenerationCutRecord }>();
  /** Episodes whose calls are being stopped (retire, ledger retire/delete): admission answers stale_attempt meanwhile. */
  private readonly stopping = new Set<CallSelector>();
  private round = { cut: 0, cut_failed: 0, cut_skipped: 0 };
  /** This round's skipped calls by SKIP_CATEGORIES name. */
  private readonly skipReasons = new Map<string, number>();
  /** Refuses new calls while the ledger's storage refuses rows. */
  private readonly ledgerOutage: LedgerOutage;

  constructor(private readonly options: ModelKindOptions) {
    this.ledger = new CaptureLedger(options.ledgerDir, options.ledgerStripes, undefined, {
      ...(options.ledgerWrite && { write: options.ledgerWrite }),
      ...(options.ledgerSync && { sync: options.ledgerSync }),
      ...(options.ledgerCacheRows !== undefined && { maxCachedRows: options.ledgerCacheRows }),
      onCorrupt: (path, lines) => options.logger?.warn({ path, lines }, "capture ledger has unreadable lines; new calls continue, a checkpoint of its episode is refused"),
      onLockReleaseFailed: (path, error) => options.logger?.warn({ path, err: error }, "capture ledger lock file not removed; the stripe stays held here and its release is tried again"),
    });
    this.ledgerOutage = new LedgerOutage(options.ledgerDir, () => this.ledger.probeWritable(), options.ledgerProbeIntervalMs ?? LEDGER_PROBE_INTERVAL_MS, options.logger);
  }

  attach(context: ParticipantContext): void {
    this.context = context;
  }

  /** Where the cut inventory's checkpoint id comes from (the control plane's active id). */
  bindCheckpointId(source: () => string | null): void {
    this.checkpointIdSource = source;
  }

  /** Whether a new call would be admitted now: not while a checkpoint is open, nor once shutdown began. */
  get admissionOpen(): boolean {
    return this.admitting && !this.closing;
  }

  // ---- data plane -------------------------------------------------------------------------

  /**
   * Opens a ticket for a generation call, or refuses (`stale_attempt`, `admission_closed`).
   * `parsed` is the key's episode when the caller already validated it (the proxy parsed the path).
   */
  async admit(key: string, route: string, body: Record<string, unknown>, parsed?: EpisodeId): Promise<AdmissionTicket> {
    const episode = parsed ?? parseCaptureKey(key);
    if (!episode) throw new CheckpointError("rollout_id_required", `not a capture key: ${key}`);
    this.refuseIfNotAdmitting(episode, key);
    // While this call is admitted (its key's rows read, the storage tried again), afterCommit does not
    // free that ledger (it is kept restored instead); a removal already under way ends first, so no
    // call continues rows being deleted.
    this.admitsInFlight.set(key, (this.admitsInFlight.get(key) ?? 0) + 1);
    let settle!: () => void;
    const pending = { episode, settled: new Promise<void>((resolve) => (settle = resolve)) };
    this.admitsUnderWay.add(pending);
    let rows: readonly LedgerRow[];
    try {
      // Refused before the backend generates anything while the ledger's storage refuses rows.
      await this.ledgerOutage.admit();
      await this.removals.get(key);
      rows = await this.ledger.rows(key);
    } finally {
      const left = this.admitsInFlight.get(key)! - 1;
      if (left === 0) this.admitsInFlight.delete(key);
      else this.admitsInFlight.set(key, left);
      // A forget waiting for it resumes only after the check below (same turn): a call of a fenced
      // attempt is refused there before its fence is lifted.
      this.admitsUnderWay.delete(pending);
      settle();
    }
    this.refuseIfNotAdmitting(episode, key);
    // The conversation digest (canonical JSON + sha256 of the whole conversation) is only needed by a
    // cut round or a restored cut, so it is computed on first use, not on every call.
    let digest: string | undefined;
    const requestDigest = () => (digest ??= conversationDigest(route, body));
    const constrained = constrainedReason(body);
    let claimedCut: GenerationCutRecord | null = null;
    const restored = this.restoredCuts.get(key);
    if (restored && constrained === null && restored.request_digest === requestDigest()) {
      claimedCut = restored;
      this.restoredCuts.delete(key);
    }
    this.served = true;
    this.restoredKeys.delete(key);
    this.freeing.delete(key); // a replacement started here: afterCommit keeps its ledger
    let close!: () => void;
    const closed = new Promise<void>((resolve) => (close = resolve));
    const ticket: AdmissionTicket & { close: () => void } = {
      ticketId: randomUUID(),
      captureKey: key,
      episode,
      route,
      admittedAt: Date.now() / 1000,
      modelCallId: `mc-${randomUUID()}`,
      // A row whose response is still leaving may yet be taken back (its caller left): not a parent.
      parentCallId: rows.findLast((row) => !this.openCalls.has(row.model_call_id))?.model_call_id ?? null,
      stream: body.stream === true,
      get requestDigest() {
        return requestDigest();
      },
      constrained,
      claimedCut,
      responseStarted: false,
      held: false,
      finished: false,
      cutAck: null,
      abort: new AbortController(),
      closed,
      close,
    };
    this.tickets.set(ticket.ticketId, ticket);
    this.openCalls.add(ticket.modelCallId);
    this.notify();
    return ticket;
  }

  /**
   * The backend's response is about to start. While admission is closed it is held here until
   * reopen; afterwards it is "started" and must finish sending (a prepare blocker while it streams).
   */
  async responseStart(ticket: AdmissionTicket): Promise<void> {
    while (!this.admitting && !ticket.abort.signal.aborted) {
      if (this.closing) {
        ticket.held = false;
        this.notify();
        throw new CheckpointError("admission_closed", "the model participant is shutting down while a checkpoint is open: this response is not released; retry the call against the restarted proxy");
      }
      if (!ticket.held) {
        ticket.held = true;
        participantInstruments().heldResponses.add(1);
        this.notify();
      }
      await Promise.race([this.reopened.promise, aborted(ticket.abort.signal)]);
    }
    ticket.held = false;
    if (ticket.abort.signal.aborted) throw new CheckpointError("stale_attempt", `${ticket.captureKey} was retired`);
    ticket.responseStarted = true;
    this.notify();
  }

  /**
   * The backend acknowledged the call (response complete): write its lineage row. The row is in the
   * file and the in-memory ledger when the promise resolves, so the proxy ends the response only
   * then. The ticket stays open — the key still blocks readiness — until the response has left for
   * the caller (`delivered`) or the caller left first (`undelivered`). A failed write rejects (after
   * closing the ticket) and leaves no row: the proxy then cuts the caller's response off instead of
   * ending it, so the call fails as a whole.
   */
  async record(ticket: AdmissionTicket, outcome: CallOutcome): Promise<void> {
    if (!ticket.finished) this.recording.add(ticket);
    try {
      if (!ticket.abort.signal.aborted && !this.context?.isRetired(ticket.episode)) {
        await this.ledger.append({
          capture_key: ticket.captureKey,
          model_call_id: ticket.modelCallId,
          parent_call_id: ticket.parentCallId,
          continued_from: ticket.claimedCut?.model_call_id ?? null,
          route: ticket.route.split("?")[0]!.slice(0, 200),
          staging_key: outcome.stagingKey,
          usage: outcome.usage,
          recorded_at: Date.now() / 1000,
        });
      }
    } catch (error) {
      this.ledgerOutage.failed(error);
      this.closeTicket(ticket);
      throw error;
    }
  }

  /** The recorded call's response has been handed to the caller's socket in full: the ticket closes. */
  delivered(ticket: AdmissionTicket): void {
    this.closeTicket(ticket);
  }

  /**
   * The caller left after the row was written but before its response had left in full: it cannot
   * hold the whole answer and will re-issue the call, so the row is taken back (no phantom parent,
   * nothing exported for it), and a restored cut it consumed is given back (its saved prefix is not
   * spent: exported again, continued by the re-issued call). The ticket closes once that is done,
   * even if taking it back failed (then the row, which names the cut, stays and so does the claim).
   */
  async undelivered(ticket: AdmissionTicket): Promise<void> {
    try {
      if (!ticket.abort.signal.aborted && !this.context?.isRetired(ticket.episode)) {
        await this.ledger.retract(ticket.captureKey, ticket.modelCallId);
        this.giveBackCut(ticket);
      }
    } catch (error) {
      this.options.logger?.error({ err: error, capture_key: ticket.captureKey, model_call_id: ticket.modelCallId }, "could not take back the row of an undelivered call; it stays in the ledger");
    } finally {
      this.closeTicket(ticket);
    }
  }

  /** record() and delivered() at once, for a response known to have left (tests, in-process callers). */
  async complete(ticket: AdmissionTicket, outcome: CallOutcome): Promise<void> {
    await this.record(ticket, outcome);
    this.delivered(ticket);
  }

  /**
   * The call failed or its caller left: no row, and a restored cut it consumed is given back, also
   * once its response had started: a call without a row continued nothing (as a row taken back), so
   * the re-issued call continues from the same saved prefix.
   */
  fail(ticket: AdmissionTicket): void {
    if (ticket.finished) return;
    this.giveBackCut(ticket);
    this.closeTicket(ticket);
  }

  /** An open ticket's claimed restored cut is unspent: restored again (unless retired or another is restored meanwhile). */
  private giveBackCut(ticket: AdmissionTicket): void {
    const cut = ticket.claimedCut;
    if (ticket.finished || !cut || ticket.abort.signal.aborted || this.context?.isRetired(ticket.episode) || this.restoredCuts.has(ticket.captureKey)) return;
    this.restoredCuts.set(ticket.captureKey, cut);
  }

  private closeTicket(ticket: AdmissionTicket): void {
    if (ticket.finished) return;
    ticket.finished = true;
    this.tickets.delete(ticket.ticketId);
    this.openCalls.delete(ticket.modelCallId);
    this.recording.delete(ticket);
    (ticket as AdmissionTicket & { close: () => void }).close();
    this.notify();
  }

  private refuseIfNotAdmitting(episode: EpisodeId, key: string): void {
    if (this.context?.isRetired(episode)) throw new CheckpointError("stale_attempt", fencedAttempt(key));
    for (const which of this.stopping) if (which(episode, key)) throw new CheckpointError("stale_attempt", `${key} was retired`);
    if (this.closing) throw new CheckpointError("admission_closed", "the model participant is shutting down; retry the call against its restart");
    if (!this.admitting) throw new CheckpointError("admission_closed", "a checkpoint is open; retry after it resumes");
  }

  // ---- ledger API (framework side) ----------------------------------------------------------

  async captureManifest(key: string): Promise<{ capture_key: string; records: readonly LedgerRow[] }> {
    if (!parseCaptureKey(key)) throw new CheckpointError("invalid_request", "not a capture key");
    return { capture_key: key, records: await this.readableRows(key) };
  }

  /** A key's rows, refused when its file has unreadable lines: they would drop out of the lineage unseen. */
  private async readableRows(key: string): Promise<readonly LedgerRow[]> {
    const { rows, corrupt: bad } = await this.ledger.load(key);
    if (bad.length) {
      throw new CheckpointError(
        "invalid_checkpoint_state",
        `the capture ledger of ${key} has ${bad.length} unreadable line(s) (${bad.slice(0, 10).join(", ")}); repair ${this.ledger.fileOf(key)} or retire the episode`,
      );
    }
    return rows;
  }

  /**
   * Retires the ledgers of attempts 0..N of a rollout; refused while a checkpoint is open. Their
   * in-flight calls are stopped first (as a checkpoint retire does), so no late row recreates a ledger.
   */
  async retireLedgers(episode: EpisodeId): Promise<string[]> {
    this.refuseLedgerRemoval();
    const attempts = (e: EpisodeId) => e.rollout_id === episode.rollout_id && e.attempt <= episode.attempt;
    return this.stopCalls(attempts, attempts, () => {
      this.refuseLedgerRemoval();
      // Restored state of those attempts goes with their ledgers (as a checkpoint retire drops it).
      this.dropRestored(attempts);
      return this.removeAttempts(episode.rollout_id, (attempt) => attempt <= episode.attempt);
    });
  }

  /** Deletes one ledger; refused while a checkpoint is open; its in-flight calls are stopped first. */
  async deleteLedger(key: string): Promise<void> {
    if (!parseCaptureKey(key)) throw new CheckpointError("invalid_request", "not a capture key");
    this.refuseLedgerRemoval();
    const ofKey = (_e: EpisodeId, k: string) => k === key;
    await this.stopCalls(ofKey, ofKey, () => {
      this.refuseLedgerRemoval();
      // A restored cut (and restored key) of this ledger goes with it, or a commit exports it again.
      this.dropRestored((e) => captureKey(e) === key);
      return this.ledger.remove([key]);
    });
  }

  /**
   * Stops the calls `stop` selects (aborted: the proxy drops them, no row is written) and runs
   * `removal` once they have closed, refusing new calls `refuse` selects with stale_attempt meanwhile.
   * (The HTTP removals refuse, in `removal`, when a checkpoint opened while they stopped.)
   */
  private async stopCalls<T>(refuse: CallSelector, stop: CallSelector, removal: () => Promise<T>): Promise<T> {
    this.stopping.add(refuse);
    try {
      const stopped = [...this.tickets.values()].filter((t) => stop(t.episode, t.captureKey));
      for (const t of stopped) t.abort.abort();
      await Promise.all(stopped.map((t) => t.closed));
      return await removal();
    } finally {
      this.stopping.delete(refuse);
      this.notify();
    }
  }

  private refuseLedgerRemoval(): void {
    // A commit may still read any live episode's ledger.
    if (!this.admitting) throw new CheckpointError("invalid_phase", "a checkpoint is open: retry ledger retire and delete after resume");
  }

  /** Removes a rollout's ledgers of the attempts `which` selects; `sync: false` leaves their directory fsync to the caller (one per batch). */
  private async removeAttempts(rolloutId: string, which: (attempt: number) => boolean, options: { sync?: boolean } = {}): Promise<string[]> {
    const keys = (await this.ledger.keysOfRollout(rolloutId)).filter((k) => which(k.attempt)).map((k) => k.key);
    await this.ledger.remove(keys, undefined, options);
    return keys;
  }

  // ---- ParticipantKind ------------------------------------------------------------------------

  readiness(): KindReadiness {
    const streaming = new Set<string>();
    let held = 0;
    for (const t of this.tickets.values()) {
      if (t.responseStarted && !t.finished) streaming.add(t.captureKey);
      if (t.held) held += 1;
    }
    const counts: Record<string, number> = { inflight: this.tickets.size, held, ...this.round };
    for (const [category, n] of this.skipReasons) counts[`cut_skipped.${category}`] = n;
    return { blockers: [...streaming].sort(), counts, restarts: [] };
  }

  /**
   * Closes admission and runs the cut round, bounded by the cut timeout and by the closing op's
   * deadline (less a reserve for its reply): the control-plane lock is held meanwhile, so a hung cut
   * endpoint must not hold resume or lease expiry past the deadline.
   */
  async closeAdmission(options: CloseAdmissionOptions = {}): Promise<void> {
    if (!this.admitting) return;
    const startedAt = Date.now();
    this.admitting = false;
    this.reopened = latch();
    this.latestCuts.clear();
    this.round = { cut: 0, cut_failed: 0, cut_skipped: 0 };
    this.skipReasons.clear();
    const undelivered = [...this.tickets.values()].filter((t) => !t.responseStarted && !t.finished && !t.abort.signal.aborted);
    const eligible: AdmissionTicket[] = [];
    const details = new Map<string, number>();
    for (const t of undelivered) {
      const reason = t.constrained ?? (this.options.cutBackend ? null : "backend:unknown");
      if (reason === null) eligible.push(t);
      else {
        this.round.cut_skipped += 1;
        const category = skipCategory(reason);
        this.skipReasons.set(category, (this.skipReasons.get(category) ?? 0) + 1);
        const detail = reason.slice(0, 200);
        details.set(detail, (details.get(detail) ?? 0) + 1);
      }
    }
    // The detailed reasons (request values included) go to the log only; counts use the fixed categories.
    if (details.size) this.options.logger?.info({ checkpoint_id: this.checkpointIdSource(), reasons: Object.fromEntries(details) }, "generation cut skipped");
    const backend = this.options.cutBackend;
    if (eligible.length && backend) {
      const checkpointId = this.checkpointIdSource() ?? `close-${randomUUID()}`;
      const timeoutMs = cutBudget(backend.timeoutMs, options.timeLeftMs, Date.now() - startedAt);
      const result: CutRoundResult =
        timeoutMs > 0
          ? await (this.options.cutRunner ?? runCutRound)({ ...backend, timeoutMs }, checkpointId, eligible)
          : { acks: new Map(), failed: eligible.length, error: "no time left before the deadline" };
      if (result.error) this.options.logger?.warn({ checkpoint_id: checkpointId, err: result.error, calls: eligible.length }, "generation cut failed; the calls will be regenerated");
      // The round succeeded but the backend could not keep some calls' prefixes: said here, or the
      // cut_failed count would rise with nothing telling why.
      if (result.refusals?.size) {
        this.options.logger?.warn({ checkpoint_id: checkpointId, calls: result.failed, reasons: Object.fromEntries(result.refusals) }, "generation cut refused by the backend for some calls; they will be regenerated");
      }
      let cut = 0;
      let unrecorded = 0;
      for (const t of eligible) {
        const ack = result.acks.get(t.ticketId);
        if (!ack) continue;
        let record: GenerationCutRecord;
        try {
          // Its conversation digest can fail (a body canonical JSON refuses, from an in-process caller):
          // that call's cut failed, it is regenerated; a failed cut never blocks a checkpoint.
          record = cutRecordOf(t, ack);
        } catch (error) {
          unrecorded += 1;
          this.options.logger?.warn({ checkpoint_id: checkpointId, err: error, capture_key: t.captureKey }, "generation cut not recorded; the call will be regenerated");
          continue;
        }
        cut += 1;
        t.cutAck = ack;
        const current = this.latestCuts.get(t.captureKey);
        if (!current || current.admittedAt <= t.admittedAt) this.latestCuts.set(t.captureKey, { admittedAt: t.admittedAt, record });
      }
      this.round.cut = cut;
      this.round.cut_failed = result.failed + unrecorded;
    }
    for (const outcome of ["cut", "cut_failed", "cut_skipped"] as const) {
      if (this.round[outcome]) participantInstruments().cuts.add(this.round[outcome], { outcome });
    }
    this.notify();
  }

  async openAdmission(): Promise<void> {
    this.admitting = true;
    this.latestCuts.clear();
    for (const t of this.tickets.values()) t.cutAck = null;
    this.reopened.resolve();
    this.notify();
  }

  async exportRecords(scope: EpisodeId[] | null): Promise<ModelRecord[]> {
    if (scope === null) throw new CheckpointError("invalid_request", "the model participant exports only the commit's episode_ids; a null scope is refused");
    const undelivered = new Set<string>();
    // A restored cut an undelivered call consumed: it still holds that call's saved prefix.
    const claimed = new Map<string, GenerationCutRecord>();
    for (const t of this.tickets.values()) {
      if (t.responseStarted) continue;
      undelivered.add(t.modelCallId);
      if (t.claimedCut && !t.abort.signal.aborted) claimed.set(t.captureKey, t.claimedCut);
    }
    const records: ModelRecord[] = [];
    const seen = new Set<string>();
    // A scope naming one rollout at two attempts exports the highest alone: a checkpoint holds each
    // rollout once (its restore would refuse both).
    for (const episode of currentAttemptsOnly(scope, (e) => e)) {
      const key = captureKey(episode);
      if (seen.has(key)) continue;
      seen.add(key);
      // A fenced attempt is left out, as the other kinds do, even when the scope names it: a retire
      // cut short (or a late install's free waiting for resume) may still hold its ledger, and a
      // restore of this record would continue a retired attempt.
      if (this.context?.isRetired(episode)) continue;
      const rows = (await this.readableRows(key)).filter((row) => !undelivered.has(row.model_call_id));
      // Past the record's cap its schema would fail the commit as an internal error: refused instead,
      // before anything is written, naming the episode to leave out of the scope (or retire).
      if (rows.length > MAX_MODEL_RECORD_ROWS) {
        throw new CheckpointError("payload_too_large", `${key} has ${rows.length} delivered model calls, over the ${MAX_MODEL_RECORD_ROWS} rows a model record holds: leave it out of the scope (or retire it)`);
      }
      // This round's cut is the newest; else an unconsumed restored cut; else one a call consumed but has not delivered.
      const cut = this.latestCuts.get(key)?.record ?? this.restoredCuts.get(key) ?? claimed.get(key) ?? null;
      // An episode with neither still gets a record (empty): a restore must see it to replace what
      // dead executions of its next attempts left (install only sees records).
      records.push({ episode_id: { rollout_id: episode.rollout_id, attempt: episode.attempt }, rows: [...rows], generation_cuts: cut ? [cut] : [] });
    }
    return records;
  }

  commitExtras(records: ModelRecord[]): Record<string, unknown> {
    const keys = new Set<string>();
    for (const record of records) {
      for (const row of record.rows) if (row.staging_key) keys.add(row.staging_key);
      for (const cut of record.generation_cuts) for (const key of cut.continuation.staging_keys) keys.add(key);
    }
    const list = [...keys].sort();
    // One key per delivered call: a long run outgrows a NATS message (1 MiB). Past the budget the
    // reply carries the list's size and digest; the keys themselves are in the committed records.
    // Measured as encoded: a cut backend's key may hold characters JSON escapes (a control
    // character takes 6 bytes), so its raw length could let a list 6 times the budget through.
    const bytes = Buffer.byteLength(JSON.stringify(list));
    if (bytes <= STAGING_KEYS_REPLY_BUDGET) return { staging_keys: list };
    return { staging_keys: null, staging_key_count: list.length, staging_keys_sha256: canonicalDigest(list) };
  }

  hasLiveState(): boolean {
    return this.served || this.tickets.size > 0 || this.restoredCuts.size > 0 || this.restoredKeys.size > 0;
  }

  async install(records: ModelRecord[], _extra: Record<string, unknown>): Promise<void> {
    // Validate everything before writing anything. One rollout at two attempts would be installed
    // in turn, the later record removing the ledger the earlier one had just installed.
    refuseTwoAttempts(records);
    const seen = new Set<string>();
    for (const record of records) {
      const parsed = ModelRecordSchema.safeParse(record);
      if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", "a model record does not match its schema");
      const key = captureKey(record.episode_id);
      const target = nextAttempt(record.episode_id);
      if (this.context?.isRetired(target)) throw new CheckpointError("stale_attempt", `${captureKey(target)} is retired; it cannot be restored`);
      if (seen.has(key)) throw new CheckpointError("invalid_checkpoint_state", `two model records for ${key}`);
      seen.add(key);
      // Rows keep the capture key they were written under: this attempt's, or an earlier attempt's
      // of the same rollout (a restored ledger exported again). Another key's rows would give the
      // replacement a lineage, and a parent, of a rollout it never continued.
      for (const row of record.rows) {
        const owner = parseCaptureKey(row.capture_key);
        if (!owner || owner.rollout_id !== record.episode_id.rollout_id || owner.attempt > record.episode_id.attempt) {
          throw new CheckpointError("invalid_checkpoint_state", `the model record of ${key} holds a row of ${row.capture_key}`);
        }
      }
      for (const cut of record.generation_cuts) {
        // A restored cut not yet consumed is exported again under the next attempt but still names
        // the attempt whose call was cut: same rollout, that attempt or an earlier one.
        const source = parseCaptureKey(cut.continuation.source_capture_key);
        if (!source || source.rollout_id !== record.episode_id.rollout_id || source.attempt > record.episode_id.attempt) {
          throw new CheckpointError("invalid_checkpoint_state", `the cut of ${key} names another source`);
        }
      }
    }
    // The restored cuts there were before, by rollout: each record looks at its rollout's alone (one
    // record per rollout, so the cuts this loop adds are other rollouts'), not through every cut.
    const cutsByRollout = new Map<string, { key: string; attempt: number }[]>();
    for (const key of this.restoredCuts.keys()) {
      const episode = parseCaptureKey(key);
      if (!episode) continue;
      const cuts = cutsByRollout.get(episode.rollout_id);
      if (cuts) cuts.push({ key, attempt: episode.attempt });
      else cutsByRollout.set(episode.rollout_id, [{ key, attempt: episode.attempt }]);
    }
    for (const record of records) {
      const source = record.episode_id;
      const target = nextAttempt(source);
      const targetKey = captureKey(target);
      // Whatever dead executions left for the target and later attempts is replaced.
      await this.removeAttempts(source.rollout_id, (attempt) => attempt >= target.attempt, { sync: false });
      for (const cut of cutsByRollout.get(source.rollout_id) ?? []) if (cut.attempt >= target.attempt) this.restoredCuts.delete(cut.key);
      const cut = record.generation_cuts[0];
      // An empty record (no delivered call, no cut) imports nothing: the target simply has no ledger.
      if (record.rows.length > 0 || cut) {
        await this.ledger.replace(targetKey, record.rows);
        if (cut) this.restoredCuts.set(targetKey, cut);
        this.restoredKeys.add(targetKey);
      }
      // Nothing will write the source attempts' ledgers again.
      await this.removeAttempts(source.rollout_id, (attempt) => attempt <= source.attempt, { sync: false });
    }
    // The removals made durable at once (a directory fsync each costs milliseconds: a restore of
    // thousands of episodes would spend seconds of its deadline on them).
    await this.ledger.syncRemovals();
    this.notify();
  }

  async retire(episodes: EpisodeId[]): Promise<void> {
    // Stop first, so no late row recreates a ledger: every retired attempt's calls (0..N); new calls of
    // those attempts are refused until the removal ends, also once a forget lifted the fence (a retire
    // cut short by its deadline still removes their ledgers).
    const covered = retiredBy(episodes);
    await this.stopCalls(
      covered,
      covered,
      async () => {
        // Restored state of every attempt whose ledger goes (0..N), not only of attempt N: one pass
        // for the whole retire (once per episode it was quadratic in a restore clean-up's scope).
        this.dropRestored(covered);
        for (const episode of episodes) await this.removeAttempts(episode.rollout_id, (attempt) => attempt <= episode.attempt, { sync: false });
        await this.ledger.syncRemovals();
      },
    );
  }

  async forget(rolloutIds: string[]): Promise<void> {
    const ids = new Set(rolloutIds);
    // A retire cut short by its deadline may still wait for calls it stopped (a row being written, a
    // caller slow to let go), and a call of a fenced attempt may still be being admitted (its first
    // check passed before the retire's mark): lifted now, the fence would let such a call be admitted
    // or its ledger outlive the forget. Waited for as retire does (the control plane bounds this by
    // the forget's deadline; past it no fence is lifted).
    await this.stoppedCallsEnded(ids);
    this.dropRestored((e) => ids.has(e.rollout_id));
    for (const id of ids) this.ledger.evict(id);
  }

  /** Resolves once no call of these rollouts that a retire stopped, or of a fenced attempt, is open or being admitted. */
  private async stoppedCallsEnded(rolloutIds: Set<string>): Promise<void> {
    const fenced = (episode: EpisodeId) => rolloutIds.has(episode.rollout_id) && (this.context?.isRetired(episode) ?? false);
    const open = [...this.tickets.values()].filter((t) => fenced(t.episode) || (rolloutIds.has(t.episode.rollout_id) && t.abort.signal.aborted));
    const admitting = [...this.admitsUnderWay].filter((a) => fenced(a.episode));
    await Promise.all([...open.map((t) => t.closed), ...admitting.map((a) => a.settled)]);
  }

  /** Forgets restored cuts and restored keys of the episodes `which` selects. */
  private dropRestored(which: (episode: EpisodeId) => boolean): void {
    for (const key of [...this.restoredCuts.keys()]) {
      const episode = parseCaptureKey(key);
      if (episode && which(episode)) this.restoredCuts.delete(key);
    }
    for (const key of [...this.restoredKeys]) {
      const episode = parseCaptureKey(key);
      if (episode && which(episode)) this.restoredKeys.delete(key);
    }
    // One afterCommit is freeing is dropped too: its free still runs, but failing does not restore it.
    for (const key of this.freeing.keys()) {
      const episode = parseCaptureKey(key);
      if (episode && which(episode)) this.freeing.set(key, false);
    }
  }

  statusExtras(): Record<string, unknown> {
    return { restored_generation_cuts: this.restoredCuts.size, served: this.served, cuts_enabled: this.options.cutBackend !== null, ledger_unwritable: this.ledgerOutage.refusing };
  }

  async afterCommit(scope: EpisodeId[] | null): Promise<void> {
    if (scope === null) return;
    const inScope = new Set(scope.map(captureKey));
    // Restored state whose replacement never started here and which the controller no longer
    // continues. Taken all at once, before the first await: this hook may outlive the commit and the
    // resume, and a call of one of these keys (the controller starting that attempt over from input)
    // claims it, so its ledger, with that call's row, stays.
    const freed = [...this.restoredKeys].filter((key) => !inScope.has(key));
    for (const key of freed) {
      this.restoredKeys.delete(key);
      this.restoredCuts.delete(key);
      this.freeing.set(key, true);
    }
    // A cut given back by a failed call is restored state without a restored key (its ledger was
    // claimed, so it stays): left out of the scope, nothing continues it, so it goes too.
    for (const key of [...this.restoredCuts.keys()]) if (!inScope.has(key)) this.restoredCuts.delete(key);
    // Each key on its own: one whose file cannot be removed (an I/O error, a read-only mount) stops
    // no other free, and stays restored state (unless a call claimed it meanwhile), so the next
    // commit's clean-up, a retire or a forget of its rollout deals with it; dropped untracked, its
    // ledger file was left for good.
    let failure: unknown;
    for (const key of freed) {
      const removal = this.ledger.remove([key], (k) => this.keepsFreedLedger(k), { sync: false });
      this.removals.set(
        key,
        removal.then(
          () => undefined,
          () => undefined,
        ),
      );
      try {
        await removal;
      } catch (error) {
        failure ??= error;
        if (this.freeing.get(key)) this.restoredKeys.add(key);
      } finally {
        this.freeing.delete(key);
        this.removals.delete(key);
      }
    }
    // The frees made durable once for all (a directory fsync each would cost milliseconds per key).
    await this.ledger.syncRemovals().catch((error: unknown) => void (failure ??= error));
    if (failure !== undefined) throw failure;
  }

  /**
   * Asked under the key's stripe lock, right before afterCommit removes a ledger it frees: true keeps
   * it. A call admitted meanwhile claimed it; one being admitted is reading its rows, so it stays
   * restored state (that call, admitted, claims it; refused, the next clean-up frees it).
   */
  private keepsFreedLedger(key: string): boolean {
    if (!this.freeing.has(key)) return true;
    if (!this.admitsInFlight.has(key)) return false;
    if (this.freeing.get(key)) this.restoredKeys.add(key);
    return true;
  }

  /**
   * Shutdown's first step: new calls are refused with `admission_closed` (retried against the
   * restarted proxy, as after a checkpoint), and so are responses held for an open checkpoint (and
   * any held later): no resume will release them once the participant stops, and cut at the end of
   * the drain their callers got no answer at all. Responses already started go on; close() comes
   * once they ended.
   */
  stopAdmitting(): void {
    this.closing = true;
    this.reopened.resolve();
  }

  /**
   * Shutdown: closes the ledger's file handles and releases its lock files, once every call whose row
   * was asked for has settled: a caller cut off by the shutdown never got its answer, and its row
   * (written after the cut, as work the ledger had accepted) is taken back first. The proxy bounds
   * each by its finish wait; its shutdown closes the callers' connections before this.
   */
  async close(): Promise<void> {
    await Promise.all([...this.recording].map((t) => t.closed));
    await this.ledger.close();
  }

  private notify(): void {
    this.context?.notifyReadinessChanged();
  }
}

/** Share of the time left to the deadline kept for the rest of the op (its reply), at most RESERVE_MAX_MS. */
const RESERVE_SHARE = 0.2;
const RESERVE_MAX_MS = 1_000;

/** How long the cut round may take: the cut timeout, within the time left to the op's deadline less a reserve. */
function cutBudget(timeoutMs: number, timeLeftMs: number | undefined, spentMs: number): number {
  if (timeLeftMs === undefined) return timeoutMs;
  const left = timeLeftMs - spentMs;
  return Math.max(0, Math.min(timeoutMs, Math.floor(left - Math.min(RESERVE_MAX_MS, left * RESERVE_SHARE))));
}

function latch(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => (signal.aborted ? resolve() : signal.addEventListener("abort", () => resolve(), { once: true })));
}
