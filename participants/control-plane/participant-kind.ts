import type { z } from "zod";
import type { EpisodeId, Kind, RecordBase } from "../../protocol/index.js";

/** What a kind reports about its readiness; the control plane caps and counts blockers. */
export interface KindReadiness {
  /** Capture keys (or synthetic labels) of work that is between safe boundaries. */
  blockers: string[];
  counts: Record<string, number>;
  /** Capture keys of in-flight episodes this participant cannot capture. */
  restarts: string[];
}

export interface CloseAdmissionOptions {
  /** Milliseconds until the closing op's deadline. */
  timeLeftMs?: number;
}

/** Services the control plane offers to the kind it drives. */
export interface ParticipantContext {
  /** Call whenever readiness may have changed, so a waiting prepare re-checks at once. */
  notifyReadinessChanged(): void;
  /**
   * True when the attempt was retired, or a restore here continued its rollout as a later attempt
   * (it never runs again under its old identity), and not yet forgotten: the data plane answers
   * `stale_attempt`.
   */
  isRetired(episode: EpisodeId): boolean;
}

/**
 * The kind adapter: everything that differs between environment, model, agent and resources
 * participants. The control plane owns phases, fences, leases, idempotency and storage; the kind
 * owns its episodes.
 */
export interface ParticipantKind<R extends RecordBase = RecordBase> {
  readonly kind: Kind;
  /** Strict schema of one record line; checked on export and on restore. */
  readonly recordSchema: z.ZodType<R>;
  /** Exports only a commit's episode_ids and refuses a null scope (reported in prepare, so the coordinator refuses it first). */
  readonly scopeRequired?: boolean;
  attach?(context: ParticipantContext): void;
  readiness(): KindReadiness;
  /**
   * Stop admitting new work; work in flight parks at its next boundary. `timeLeftMs` is how long the
   * op that closes (prepare, restore) has until its deadline: any work done here should fit in it.
   * One still running at that deadline is left running (the op answers `deadline_exceeded`), and
   * `openAdmission` is called only once it has ended: close and open never overlap, nor two closes.
   */
  closeAdmission(options?: CloseAdmissionOptions): Promise<void>;
  /** Reopen: parked work continues, held responses are delivered. */
  openAdmission(): Promise<void>;
  /** Records of the episodes in scope (null = all); called once per checkpoint. */
  exportRecords(scope: EpisodeId[] | null): Promise<R[]>;
  /** True while this process holds live or restored state; restore refuses then. */
  hasLiveState(): boolean;
  /** Validate every record, then install all as attempt+1, or nothing. */
  install(records: R[], extra: Record<string, unknown>): Promise<void>;
  /** Stop the attempts' work, wait until it stopped, free their state. */
  retire(episodes: EpisodeId[]): Promise<void>;
  /** Drop whatever the kind keeps for finished rollouts. */
  forget(rolloutIds: string[]): Promise<void>;
  statusExtras?(): Record<string, unknown>;
  /** Extra fields for manifest.json that restore hands back to `install`. */
  manifestExtra?(): Record<string, unknown>;
  /** Extra fields for the commit reply (e.g. the model's staging keys). */
  commitExtras?(records: R[]): Record<string, unknown>;
  /** After the records are durable: free restored state outside the scope; park compute on stop. */
  afterCommit?(scope: EpisodeId[] | null, options: { stop: boolean }): Promise<void>;
}
