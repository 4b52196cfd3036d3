import { z } from "zod";
import {
  CheckpointError,
  EpisodeIdSchema,
  captureKey,
  nextAttempt,
  type EpisodeId,
  type Kind,
} from "../../protocol/index.js";
import type { KindReadiness, ParticipantContext, ParticipantKind } from "../control-plane/participant-kind.js";

export const ScriptRecordSchema = z.object({ episode_id: EpisodeIdSchema, state: z.unknown() }).strict();
export type ScriptRecord = z.infer<typeof ScriptRecordSchema>;

type Hook = "closeAdmission" | "openAdmission" | "exportRecords" | "install" | "retire" | "forget";

export interface ScriptCall {
  hook: Hook;
  at: number;
  detail?: unknown;
}

/**
 * A participant kind whose behaviour tests and demos script: episodes and their state,
 * blockers, restarts, injected failures and delays. It records every hook call in order.
 */
export class ScriptableKind implements ParticipantKind<ScriptRecord> {
  readonly recordSchema = ScriptRecordSchema;
  readonly calls: ScriptCall[] = [];
  /** Live episodes by capture key. */
  readonly episodes = new Map<string, ScriptRecord>();
  /** Restored episodes, already as their NEXT attempt, until their replacement starts. */
  readonly restored = new Map<string, ScriptRecord>();
  admissionOpen = true;
  /** Behave like the model: report `scope_required` and refuse a null-scope export. */
  scopeRequired = false;
  private blockers: string[] = [];
  private restarts: string[] = [];
  private readonly failures = new Map<Hook, Error>();
  private readonly delays = new Map<Hook, Promise<void>>();
  private context: ParticipantContext | undefined;

  constructor(readonly kind: Kind) {}

  attach(context: ParticipantContext): void {
    this.context = context;
  }

  // ---- scripting -------------------------------------------------------------------------

  addEpisode(episode: EpisodeId, state: unknown = { step: 0 }): void {
    this.episodes.set(captureKey(episode), { episode_id: episode, state });
  }

  setBlockers(blockers: string[]): void {
    this.blockers = blockers;
    this.context?.notifyReadinessChanged();
  }

  setRestarts(restarts: string[]): void {
    this.restarts = restarts;
  }

  /** The next call of `hook` throws `error`. */
  failNext(hook: Hook, error: Error = new Error(`scripted ${hook} failure`)): void {
    this.failures.set(hook, error);
  }

  /** Calls of `hook` wait until `until` settles. */
  delay(hook: Hook, until: Promise<void>): void {
    this.delays.set(hook, until);
  }

  hooks(): Hook[] {
    return this.calls.map((c) => c.hook);
  }

  private async enter(hook: Hook, detail?: unknown): Promise<void> {
    this.calls.push({ hook, at: Date.now(), ...(detail === undefined ? {} : { detail }) });
    const delay = this.delays.get(hook);
    if (delay) await delay;
    const failure = this.failures.get(hook);
    if (failure) {
      this.failures.delete(hook);
      throw failure;
    }
  }

  // ---- ParticipantKind ---------------------------------------------------------------------

  readiness(): KindReadiness {
    return { blockers: [...this.blockers], counts: { episodes: this.episodes.size, restored: this.restored.size }, restarts: [...this.restarts] };
  }

  async closeAdmission(): Promise<void> {
    await this.enter("closeAdmission");
    this.admissionOpen = false;
  }

  async openAdmission(): Promise<void> {
    await this.enter("openAdmission");
    this.admissionOpen = true;
  }

  async exportRecords(scope: EpisodeId[] | null): Promise<ScriptRecord[]> {
    await this.enter("exportRecords", scope);
    if (scope === null && this.scopeRequired) throw new CheckpointError("invalid_request", "this participant exports only the commit's episode_ids");
    // Fenced attempts are left out, as the real kinds do: a retire cut short (or a late install's
    // free deferred) may still hold them, and a restore of this export would bring them back.
    const wanted = scope ? new Set(scope.map(captureKey)) : undefined;
    const exported = (r: ScriptRecord) => !this.context?.isRetired(r.episode_id) && (!wanted || wanted.has(captureKey(r.episode_id)));
    const live = [...this.episodes.values()].filter(exported);
    // Restored episodes whose replacement has not started are exported again as that next attempt,
    // so a second crash still continues them (as attempt+2).
    const pending = [...this.restored.values()].filter(exported);
    return [...live, ...pending];
  }

  hasLiveState(): boolean {
    return this.episodes.size > 0 || this.restored.size > 0;
  }

  async install(records: ScriptRecord[]): Promise<void> {
    await this.enter("install", records.length);
    for (const record of records) {
      if (this.context?.isRetired(nextAttempt(record.episode_id))) {
        throw new CheckpointError("stale_attempt", `${captureKey(nextAttempt(record.episode_id))} is retired`);
      }
    }
    for (const record of records) {
      const next = nextAttempt(record.episode_id);
      this.restored.set(captureKey(next), { episode_id: next, state: record.state });
    }
  }

  /** The replacement attempt starts: it takes its restored state exactly once. */
  claim(episode: EpisodeId): ScriptRecord | undefined {
    const key = captureKey(episode);
    const record = this.restored.get(key);
    this.restored.delete(key);
    if (record) this.episodes.set(key, { episode_id: episode, state: record.state });
    return record;
  }

  async retire(episodes: EpisodeId[]): Promise<void> {
    await this.enter("retire", episodes.map(captureKey));
    for (const episode of episodes) {
      for (const [key, record] of [...this.episodes]) {
        if (record.episode_id.rollout_id === episode.rollout_id && record.episode_id.attempt <= episode.attempt) this.episodes.delete(key);
      }
      for (const [key] of [...this.restored]) {
        const pending = this.restored.get(key)!;
        if (pending.episode_id.rollout_id === episode.rollout_id && pending.episode_id.attempt <= episode.attempt) this.restored.delete(key);
      }
    }
  }

  async forget(rolloutIds: string[]): Promise<void> {
    await this.enter("forget", rolloutIds);
  }

  statusExtras(): Record<string, unknown> {
    return { accepting: this.admissionOpen, restored_pending: this.restored.size };
  }
}
