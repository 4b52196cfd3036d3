import type { EpisodeId } from "../../../protocol/index.js";
import type { Clock } from "../../control-plane/clock.js";
import { systemClock } from "../../control-plane/clock.js";
import type { KindReadiness, ParticipantContext, ParticipantKind } from "../../control-plane/participant-kind.js";
import type { StepEpisode } from "./episode-steps.js";
import { EnvironmentRecordSchema, type EnvironmentRecord } from "./environment-record.js";
import { RestorableEpisodes, type BeginOptions } from "./restorable-episodes.js";

/**
 * The environment participant (protocol §5.3): it owns the episode protocol and records one
 * boundary per episode. Episode code runs inside `begin`, which checks the retired fence, takes
 * the restored record, refuses while admission is closed, and hands over the continuation once.
 */
export class EnvironmentKind implements ParticipantKind<EnvironmentRecord> {
  readonly kind = "environment" as const;
  readonly recordSchema = EnvironmentRecordSchema;
  private context: ParticipantContext | undefined;
  readonly episodes: RestorableEpisodes;

  constructor(clock: Clock = systemClock) {
    this.episodes = new RestorableEpisodes(
      (episode) => this.context?.isRetired(episode) ?? false,
      () => this.context?.notifyReadinessChanged(),
      clock,
    );
  }

  attach(context: ParticipantContext): void {
    this.context = context;
  }

  /** Runs one episode (`/run`): refusals are thrown before anything changes. */
  begin<T>(episode: EpisodeId, task: unknown, options: BeginOptions, fn: (episode: StepEpisode) => Promise<T>): Promise<T> {
    return this.episodes.begin(episode, task, options, fn);
  }

  readiness(): KindReadiness {
    // parked / replay_step count what a commit exports now (restarts and retiring episodes are not).
    const exportable = this.episodes.steps.exportableCounts();
    return {
      blockers: this.episodes.steps.blockers(),
      counts: { episodes: this.episodes.steps.size, ...exportable, restored_pending: this.episodes.pendingCount },
      restarts: this.episodes.steps.restarts(),
    };
  }

  async closeAdmission(): Promise<void> {
    this.episodes.steps.close();
  }

  async openAdmission(): Promise<void> {
    this.episodes.steps.open();
  }

  async exportRecords(scope: EpisodeId[] | null): Promise<EnvironmentRecord[]> {
    return this.episodes.exportSnapshots(scope);
  }

  hasLiveState(): boolean {
    return this.episodes.hasLiveState();
  }

  async install(records: EnvironmentRecord[]): Promise<void> {
    this.episodes.install(records);
  }

  async retire(episodes: EpisodeId[]): Promise<void> {
    await this.episodes.retire(episodes);
  }

  async forget(rolloutIds: string[]): Promise<void> {
    // Nothing is kept per finished rollout beyond the control plane's retired marks. But a retire
    // cut short by its deadline may still wait for an episode slow to stop: its fence is lifted only
    // once it ended (the control plane bounds this by the forget's deadline), or the callees'
    // forgets after this one would admit its late calls.
    await this.episodes.steps.retiredEnded(rolloutIds);
  }

  async afterCommit(scope: EpisodeId[] | null): Promise<void> {
    this.episodes.dropPendingOutside(scope);
  }

  statusExtras(): Record<string, unknown> {
    return {
      restored_pending: this.episodes.pendingCount,
      episodes: this.episodes.steps.size,
      accepting: !this.episodes.steps.gate.closed,
    };
  }
}
