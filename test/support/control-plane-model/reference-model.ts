import { captureKey, nextAttempt, type EpisodeId, type Phase, type PhaseOp } from "../../../protocol/index.js";

/**
 * What docs/protocol.md says one participant's control plane does with a message, for a
 * model-based test: the reply it must give (a refusal code, a kept reply, or a fresh success) and
 * the state it must be in afterwards. Sequential messages only (each answered before the next).
 */

export interface Cached {
  args: string;
  reply: unknown;
  pin?: string;
}

/** What the model expects of one message. `admitted`: it raises the epoch fence (docs: "on admission"). */
export type Prediction =
  | { kind: "refusal"; code: string; admitted: boolean }
  | { kind: "kept"; reply: unknown }
  | { kind: "fresh" }
  /** A commit into a directory where an earlier process published this checkpoint: idempotent if identical, else checkpoint_conflict (docs: create-only manifest). */
  | { kind: "republish" }
  /** A prepare that has to wait for blockers: the test decides how that wait ends. */
  | { kind: "waits" };

/** What the world looks like to the op (read by the driver before it sends it). */
export interface Surroundings {
  nowMs: number;
  live: boolean;
  blocked: boolean;
  restarts: readonly string[];
  closeFails: boolean;
  installFails: boolean;
  openFails: boolean;
  writeFails: boolean;
  incarnation: string;
  /** The checkpoint directory as the participant will see it. */
  dir?: { inside: boolean; visible: boolean; manifestSha256?: string; records?: EpisodeId[] };
}

export const GRACE_S = 60;
const MAX_AHEAD_S = 7 * 24 * 3600;
const RESUMED_KEPT = 64;
const RESUMED_COMMITS_KEPT = 4;

export class ReferenceModel {
  highest = 0;
  phase: Phase = "idle";
  activeId: string | null = null;
  lease: number | null = null;
  resumed: string[] = [];
  cache = new Map<string, Cached>();
  resumedCommits = new Map<string, Cached>();
  /** The export a commit of the open checkpoint made; `written` once its write succeeded (a retry then writes nothing). */
  pendingWrite: { id: string; args: string; written?: boolean } | undefined;
  retired = new Map<string, number>();
  restoredFrom = new Map<string, number>();

  /** A fresh process (a restart): only the epoch floor survives, read from the leader lease. */
  restart(): void {
    const highest = this.highest;
    Object.assign(this, new ReferenceModel());
    this.highest = highest;
  }

  isFenced(episode: EpisodeId): boolean {
    for (const marks of [this.retired, this.restoredFrom]) {
      const mark = marks.get(episode.rollout_id);
      if (mark !== undefined && episode.attempt <= mark) return true;
    }
    return false;
  }

  predict(op: PhaseOp, request: any, env: Surroundings): Prediction {
    const refuse = (code: string, admitted: boolean): Prediction => ({ kind: "refusal", code, admitted });
    if (["prepare", "renew", "commit", "resume"].includes(op) && request.incarnation !== undefined && request.incarnation !== env.incarnation) {
      return refuse("stale_incarnation", false);
    }
    if (request.epoch < this.highest) return refuse("stale_epoch", false);
    const deadline = request.deadline_ts as number;
    const past = deadline * 1000 <= env.nowMs;
    const far = deadline * 1000 > env.nowMs + MAX_AHEAD_S * 1000;
    if (op !== "resume" && op !== "restore") {
      if (past) return refuse("deadline_exceeded", false);
      if (far) return refuse("invalid_request", false);
    }
    const id = request.checkpoint_id as string;
    const fenced = this.resumed.includes(id);
    const admit = (allowed: readonly Phase[]): string | undefined => {
      if (fenced) return "stale_checkpoint";
      if (this.activeId !== null && this.activeId !== id) return "checkpoint_conflict";
      if (!allowed.includes(this.phase)) return "invalid_phase";
      return undefined;
    };
    switch (op) {
      case "prepare": {
        const kept = this.cache.get(key(id, "prepare"));
        if (kept) return { kind: "kept", reply: kept.reply };
        const refused = admit(["idle", "preparing"]);
        if (refused) return refuse(refused, true);
        if (this.phase === "idle" && env.closeFails) return refuse("internal_error", true);
        return env.blocked ? { kind: "waits" } : { kind: "fresh" };
      }
      case "commit": {
        if (!env.dir!.inside) return refuse("invalid_request", false);
        const args = commitArgs(request);
        const kept = this.cache.get(key(id, "commit")) ?? (fenced ? this.resumedCommits.get(id) : undefined);
        if (kept) return kept.args === args ? { kind: "kept", reply: kept.reply } : refuse("checkpoint_conflict", true);
        const refused = admit(["prepared"]);
        if (refused) return refuse(refused, true);
        if (this.pendingWrite?.id === id && this.pendingWrite.args !== args) return refuse("checkpoint_conflict", true);
        if (env.blocked) return refuse("invalid_phase", true);
        if (request.episode_ids !== null && request.episode_ids.some((e: EpisodeId) => env.restarts.includes(captureKey(e)))) return refuse("restart_in_scope", true);
        if (!env.dir!.visible) return refuse("storage_error", true);
        if (env.writeFails && !(this.pendingWrite?.id === id && this.pendingWrite.written)) return refuse("storage_error", true);
        return env.dir!.manifestSha256 === undefined ? { kind: "fresh" } : { kind: "republish" };
      }
      case "restore": {
        if (past) return refuse(this.lateRestoreRefusal(id, env), false);
        if (far) return refuse("invalid_request", false);
        if (!env.dir!.inside) return refuse("invalid_request", false);
        const kept = this.cache.get(key(id, "restore"));
        if (kept) {
          if (kept.args !== restoreArgs(request)) return refuse("checkpoint_conflict", true);
          if (request.manifest_sha256 !== undefined && request.manifest_sha256 !== kept.pin) return refuse("checkpoint_conflict", true);
          return { kind: "kept", reply: kept.reply };
        }
        const refused = admit(["idle"]);
        if (refused) return refuse(refused, true);
        if (env.live) return refuse("invalid_checkpoint_state", true);
        const dir = env.dir!;
        if (dir.manifestSha256 === undefined) return refuse("invalid_checkpoint_state", true);
        if (request.manifest_sha256 !== undefined && request.manifest_sha256 !== dir.manifestSha256) return refuse("invalid_checkpoint_state", true);
        if (env.closeFails || env.installFails) return refuse("internal_error", true);
        const scope = new Set(request.episode_ids.map(captureKey));
        const installed = dir.records!.filter((e) => scope.has(captureKey(e)));
        if (installed.some((e) => this.isFenced(nextAttempt(e)))) return refuse("stale_attempt", true);
        return { kind: "fresh" };
      }
      case "resume":
        if (this.activeId === id && env.openFails) return refuse("internal_error", true);
        if (this.activeId === id || fenced || this.activeId === null) return { kind: "fresh" };
        return refuse("checkpoint_conflict", true);
      case "renew": {
        const refused = admit(["preparing", "prepared", "committed", "restored"]);
        return refused ? refuse(refused, true) : { kind: "fresh" };
      }
      case "retire":
      case "forget":
        if (this.phase !== "idle" && this.phase !== "restored") return refuse("invalid_phase", true);
        if (this.phase === "restored" && this.activeId !== id) return refuse("checkpoint_conflict", true);
        return { kind: "fresh" };
    }
  }

  /** docs: a restore past its deadline answers the refusal it would give in time, while nothing of a restore may be installed. */
  private lateRestoreRefusal(id: string, env: Surroundings): string {
    if (this.activeId === id) return "deadline_exceeded";
    if (this.resumed.includes(id)) return "stale_checkpoint";
    if (this.activeId !== null) return "checkpoint_conflict";
    if (this.phase !== "idle") return "invalid_phase";
    return env.live ? "invalid_checkpoint_state" : "deadline_exceeded";
  }

  /** The fence rises on admission, whatever the op's outcome. */
  admitted(epoch: number): void {
    this.highest = Math.max(this.highest, epoch);
  }

  renewLease(deadline: number): void {
    this.lease = Math.max(this.lease ?? 0, deadline + GRACE_S);
  }

  /** Resume and lease expiry (with the id), failed prepare (without): back to idle. */
  reopen(resumedId: string | undefined): void {
    this.stopWrite(resumedId);
    this.phase = "idle";
    this.activeId = null;
    this.lease = null;
  }

  /**
   * What a reopen does before the kind's openAdmission: the id fenced, its kept replies dropped,
   * its write stopped. All that stands when openAdmission then throws (docs: the phase stays).
   */
  stopWrite(resumedId: string | undefined): void {
    if (resumedId !== undefined) {
      this.fence(resumedId);
      const committed = this.cache.get(key(resumedId, "commit"));
      if (committed) {
        this.resumedCommits.set(resumedId, committed);
        for (const id of this.resumedCommits.keys()) if (this.resumedCommits.size > RESUMED_COMMITS_KEPT) this.resumedCommits.delete(id);
      }
      for (const k of [...this.cache.keys()]) if (k.startsWith(`${resumedId}\u0000`)) this.cache.delete(k);
    }
    this.pendingWrite = undefined;
  }

  fence(id: string): void {
    this.resumed = this.resumed.filter((r) => r !== id);
    this.resumed.push(id);
    if (this.resumed.length > RESUMED_KEPT) this.resumed.shift();
  }

  /** Time passes: a lease that runs out resumes the checkpoint as a resume would. */
  advanceTo(nowMs: number): void {
    if (this.lease !== null && nowMs >= this.lease * 1000) this.reopen(this.activeId ?? undefined);
  }

  remember(id: string, op: string, reply: unknown, args = "", pin?: string): void {
    this.cache.set(key(id, op), { reply, args, ...(pin !== undefined && { pin }) });
  }

  mark(marks: Map<string, number>, episode: EpisodeId): void {
    const current = marks.get(episode.rollout_id);
    if (current === undefined || episode.attempt > current) marks.set(episode.rollout_id, episode.attempt);
  }
}

export function key(id: string, op: string): string {
  return `${id}\u0000${op}`;
}

export function commitArgs(request: { checkpoint_dir: string; episode_ids: EpisodeId[] | null; stop?: boolean }): string {
  const scope = request.episode_ids === null ? "*" : [...new Set(request.episode_ids.map(captureKey))].sort().join(",");
  return `${request.checkpoint_dir}\u0000${scope}\u0000${request.stop ?? false}`;
}

export function restoreArgs(request: { checkpoint_dir: string; episode_ids: EpisodeId[] }): string {
  return `${request.checkpoint_dir}\u0000${[...new Set(request.episode_ids.map(captureKey))].sort().join(",")}`;
}
