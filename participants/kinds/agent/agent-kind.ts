import { CheckpointError, captureKey, nextAttempt, type EpisodeId } from "../../../protocol/index.js";
import type { Clock } from "../../control-plane/clock.js";
import { systemClock } from "../../control-plane/clock.js";
import { currentAttemptsOnly, refuseTwoAttempts } from "../../control-plane/one-attempt-per-rollout.js";
import type { KindReadiness, ParticipantContext, ParticipantKind } from "../../control-plane/participant-kind.js";
import type { StepEpisode } from "../environment/episode-steps.js";
import { RestorableEpisodes, type BeginOptions } from "../environment/restorable-episodes.js";
import { AgentRecordSchema, LegacySessionSchema, type AgentRecord } from "./agent-record.js";
import { noSessionHooks, type AgentSessionHooks, type RestoredAgentSession } from "./agent-session-hooks.js";
import { AgentSessions, type ActivateOptions, type Activation } from "./agent-sessions.js";

/**
 * The agent participant (protocol §7): native sessions invoked by an environment server, and
 * legacy `/run` episodes the agent owns entirely (tracked by the same step tracker as the
 * environment). Session keys are the logical rollout id, so a replacement attempt finds its
 * restored session.
 */
export class AgentKind implements ParticipantKind<AgentRecord> {
  readonly kind = "agent" as const;
  readonly recordSchema = AgentRecordSchema;
  readonly sessions: AgentSessions;
  readonly legacy: RestorableEpisodes;
  private context: ParticipantContext | undefined;

  constructor(
    private readonly hooks: AgentSessionHooks = noSessionHooks,
    clock: Clock = systemClock,
  ) {
    const isRetired = (episode: EpisodeId) => this.context?.isRetired(episode) ?? false;
    const notify = () => this.context?.notifyReadinessChanged();
    this.sessions = new AgentSessions(isRetired, notify, clock);
    this.legacy = new RestorableEpisodes(isRetired, notify, clock);
  }

  attach(context: ParticipantContext): void {
    this.context = context;
  }

  // ---- data plane ------------------------------------------------------------------------

  openSession(episode: EpisodeId, key: string = episode.rollout_id): { restored: boolean } {
    return this.sessions.openSession(episode, key);
  }

  activate<T>(episode: EpisodeId, fn: (activation: Activation) => Promise<T>, key: string = episode.rollout_id, options: ActivateOptions = {}): Promise<T> {
    return this.sessions.activate(episode, key, fn, options);
  }

  async closeSession(episode: EpisodeId, key: string = episode.rollout_id): Promise<void> {
    // Free, then drop: a free that throws leaves the session held (never reopened, not a blocker), so
    // a retried close, a retire, a forget or the next commit's clean-up frees it instead of leaking it.
    const held = await this.sessions.closeSession(episode, key);
    if (held) await this.sessions.freeHeld(held, "freeing", this.free);
  }

  /** Frees one session's state (the hook); `AgentSessions.freeHeld` decides whether it still may. */
  private readonly free = (key: string): Promise<void> => this.hooks.retireAgentSession(key);

  /** A legacy `/run` episode: the agent owns seed, turn loop and verify. */
  runLegacy<T>(episode: EpisodeId, task: unknown, options: BeginOptions, fn: (episode: StepEpisode) => Promise<T>): Promise<T> {
    return this.legacy.begin(episode, task, options, fn);
  }

  // ---- ParticipantKind -------------------------------------------------------------------

  readiness(): KindReadiness {
    const states = this.sessions.states();
    return {
      blockers: [...this.sessions.blockers(), ...this.legacy.steps.blockers()],
      counts: {
        sessions: this.sessions.size,
        running: states.running,
        at_boundary: states.at_boundary,
        idle: states.idle,
        legacy_episodes: this.legacy.steps.size,
        restored_pending: this.sessions.restoredPending + this.legacy.pendingCount,
      },
      restarts: [...this.sessions.restarts(), ...this.legacy.steps.restarts()],
    };
  }

  async closeAdmission(): Promise<void> {
    this.sessions.close();
    this.legacy.steps.close();
  }

  async openAdmission(): Promise<void> {
    this.sessions.open();
    this.legacy.steps.open();
  }

  async exportRecords(scope: EpisodeId[] | null): Promise<AgentRecord[]> {
    // One attempt per rollout across sessions (each key its own) and legacy episodes, before the
    // hooks export any state: the highest, as a legacy episode's pending record gives way to a later attempt.
    const all = [
      ...this.sessions.exportable(scope).map((s) => ({ episode: s.episode, session: s, legacy: undefined })),
      ...this.legacy.exportSnapshots(scope).map((l) => ({ episode: l.episode_id, session: undefined, legacy: l })),
    ];
    const current = currentAttemptsOnly(all, (item) => item.episode);
    const sessions = current.flatMap((item) => (item.session ? [item.session] : []));
    const states = sessions.length ? await this.hooks.exportAgentSessions(sessions.map((s) => s.key)) : {};
    const records: AgentRecord[] = sessions.map((s) => {
      // Own keys only: a rollout id may be `constructor` or `toString`.
      if (!Object.hasOwn(states, s.key)) throw new CheckpointError("internal_error", `the agent hooks exported no state for session ${s.key}`);
      return { episode_id: s.episode, mode: "session", session_key: s.key, session: states[s.key] ?? null, boundary: s.boundary, episode: null };
    });
    for (const legacy of current.flatMap((item) => (item.legacy ? [item.legacy] : []))) {
      records.push({
        episode_id: legacy.episode_id,
        mode: "legacy",
        session_key: legacy.episode_id.rollout_id,
        session: { task_digest: legacy.task_digest },
        boundary: null,
        episode: legacy.boundary,
      });
    }
    return records;
  }

  hasLiveState(): boolean {
    return this.sessions.size > 0 || this.legacy.hasLiveState();
  }

  /** Validates every record, then installs all as attempt+1, or nothing. */
  async install(records: AgentRecord[]): Promise<void> {
    if (this.hasLiveState()) throw new CheckpointError("invalid_checkpoint_state", "restore needs a fresh process: sessions or episodes are live here");
    const sessionRecords = records.filter((r) => r.mode === "session");
    const legacyRecords = records.filter((r) => r.mode === "legacy");
    // Across both modes and every session key: the per-key check below would take them all.
    refuseTwoAttempts(records);
    const keys = new Set<string>();
    for (const record of records) {
      const target = nextAttempt(record.episode_id);
      if (this.context?.isRetired(target)) throw new CheckpointError("stale_attempt", `${captureKey(target)} is retired; it cannot be restored`);
      const key = `${record.mode}:${record.session_key}`;
      if (keys.has(key)) throw new CheckpointError("invalid_checkpoint_state", `two ${record.mode} records for ${record.session_key}`);
      keys.add(key);
      // A legacy episode is keyed by its rollout; a native session by whatever key it was opened
      // under (openSession's `key`), which its replacement opens again.
      if (record.mode === "legacy" && record.session_key !== record.episode_id.rollout_id) {
        throw new CheckpointError("invalid_checkpoint_state", `session key ${record.session_key} does not name rollout ${record.episode_id.rollout_id}`);
      }
    }
    const legacy = legacyRecords.map((r) => {
      const parsed = LegacySessionSchema.safeParse(r.session);
      if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `legacy record ${captureKey(r.episode_id)} has no valid task digest`);
      return { episode_id: r.episode_id, task_digest: parsed.data.task_digest, boundary: r.episode };
    });
    // The hooks validate their own state and install all or nothing; only then do sessions appear.
    const restored = sessionRecords.map((r) => ({ session_key: r.session_key, episode_id: nextAttempt(r.episode_id), session: r.session }));
    try {
      await this.hooks.restoreAgentSessions(restored);
    } catch (error) {
      await this.freeFailedRestore(restored, error);
      throw error;
    }
    this.sessions.installRestored(sessionRecords.map((r) => ({ key: r.session_key, episode: nextAttempt(r.episode_id), boundary: r.boundary })));
    this.legacy.install(legacy);
  }

  /**
   * After a restoreAgentSessions that threw: one that failed part way may hold sessions nothing
   * here tracks, which no retire would free, so every key it was handed is freed now. A key whose
   * free fails is held as a session of its next attempt that is retiring (a blocker), and the
   * restore answers `internal_error`, so the coordinator's clean-up retires attempt+1 here, which
   * frees it.
   */
  private async freeFailedRestore(restored: RestoredAgentSession[], cause: unknown): Promise<void> {
    const kept: RestoredAgentSession[] = [];
    const failures: string[] = [];
    for (const session of restored) {
      try {
        await this.hooks.retireAgentSession(session.session_key);
      } catch (error) {
        kept.push(session);
        failures.push(`${captureKey(session.episode_id)}: ${error instanceof Error ? error.message : String(error)}`);
      }
    }
    if (kept.length === 0) return;
    this.sessions.holdRetiring(kept.map((s) => ({ key: s.session_key, episode: s.episode_id })));
    const why = cause instanceof Error ? cause.message : String(cause);
    throw new CheckpointError(
      "internal_error",
      `restoring agent sessions failed: ${why}; freeing ${kept.length} of them failed too (${failures[0]}): they are held as their next attempt, blocking, until a retire of it frees them`,
      { cause },
    );
  }

  async retire(episodes: EpisodeId[]): Promise<void> {
    // Both at once: an activation slow to stop on its signal must not hold off aborting the legacy
    // /run episodes of the same retire, whose turn loops would go on calling for the retired attempts.
    const [stopped] = await Promise.all([this.sessions.retire(episodes), this.legacy.retire(episodes)]);
    // Free, then drop: a free that throws leaves its session retiring (a blocker that no open_session
    // can reopen), so a retried retire finds it and frees it again instead of losing its state. This
    // loop may outlive the retire's deadline: freeHeld skips a session another loop freed meanwhile.
    for (const s of stopped) await this.sessions.freeHeld(s, "retiring", this.free);
  }

  async forget(rolloutIds: string[]): Promise<void> {
    // Retired marks live in the control plane. A session whose retire could not free it is still
    // held (retiring, a blocker) and no later retire lists it once its fence is lifted: freed here
    // first, and the forget fails (its fence kept) while a free does. So is one a failed free left held otherwise.
    // A retire cut short by its deadline may still wait for a turn loop it stopped (an activation or
    // a legacy /run slow to stop): lifted now, the fences of the callees (forgotten after this one)
    // would admit that loop's late calls. Waited for as retire does (the control plane bounds this by
    // the forget's deadline; past it no fence is lifted).
    await Promise.all([this.sessions.retiredActivationsEnded(rolloutIds), this.legacy.steps.retiredEnded(rolloutIds)]);
    for (const s of this.sessions.heldOf(rolloutIds)) await this.sessions.freeHeld(s, "held", this.free);
  }

  /** Restored state the controller no longer continues is freed (not fenced: it may start that attempt over). */
  async afterCommit(scope: EpisodeId[] | null): Promise<void> {
    // Free, then drop. All held before the first hook's await: none can be claimed meanwhile, and
    // the key is refused (admission_closed, retryable) until its free ended, so a new attempt never
    // opens over the old restored state (the reference agent would inherit its cookie).
    // A free that throws leaves its session held and the loop carries on; held ones (this commit's,
    // or an earlier clean-up's or close's whose free failed) are freed again here at every commit.
    // The loop may outlive the commit: freeHeld skips a session another loop freed meanwhile.
    this.sessions.leaveOutUnclaimed(scope);
    // Before the first await too: a free may outlive the commit, and the controller may then start a
    // left-out rollout over as this very attempt, whose /run must not take the old record.
    this.legacy.dropPendingOutside(scope);
    const failures: string[] = [];
    for (const s of this.sessions.heldForFreeing()) {
      try {
        await this.sessions.freeHeld(s, "freeing", this.free);
      } catch (error) {
        failures.push(`${s.key}: ${error instanceof Error ? error.message : String(error)}`);
      }
    }
    if (failures.length) {
      throw new CheckpointError("internal_error", `freeing ${failures.length} session(s) (restored ones the commit left out, or closed) failed (${failures[0]}): held until a later commit, retire or forget frees them`);
    }
  }

  statusExtras(): Record<string, unknown> {
    return {
      accepting: !this.sessions.gate.closed,
      sessions: this.sessions.size,
      legacy_episodes: this.legacy.steps.size,
      restored_pending: this.sessions.restoredPending + this.legacy.pendingCount,
    };
  }
}
