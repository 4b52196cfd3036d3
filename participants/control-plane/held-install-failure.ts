import { CheckpointError, RESTORE_REFUSALS, toCheckpointError, type EpisodeId } from "../../protocol/index.js";
import { retiredBy } from "./attempt-marks.js";

/**
 * The refusal of a restore whose install failed yet left state held here: a kind that could not
 * free what its hook installed keeps it as attempt+1 and answers a code (internal_error) that has
 * the coordinator's clean-up retire attempt+1 here. A successor that lost that clean-up (its
 * leader died before journaling it) sends the same restore again; "restore needs a fresh process"
 * would read as a refusal that changed nothing, so attempt+1 would never be retired here and the
 * held state would stay for good. While it is held, that same restore gets this refusal again.
 */
export class HeldInstallFailure {
  private held: { id: string; args: string; error: unknown; next: EpisodeId[] } | undefined;

  /** A failed install of restore `id` (`args`: its directory and scope) that left state here. */
  remember(id: string, args: string, error: unknown, next: EpisodeId[]): void {
    this.held = { id, args, error, next };
  }

  /** The refusal to answer the same restore with again, while the kind still holds state. */
  repeat(id: string, args: string, holdsState: boolean): unknown {
    if (!holdsState) this.held = undefined;
    return this.held && this.held.id === id && this.held.args === args ? this.held.error : undefined;
  }

  /** Whether restore `id`'s failed install is still held here. */
  holds(id: string): boolean {
    return this.held?.id === id;
  }

  /** A retire that covered every attempt it installed freed what it held. */
  retired(episodes: EpisodeId[]): void {
    if (this.held?.next.every(retiredBy(episodes))) this.held = undefined;
  }

  /** A forget of every rollout it installed (the kind frees what it holds of them first). */
  forgotten(rollouts: string[]): void {
    const forgotten = new Set(rollouts);
    if (this.held?.next.every((n) => forgotten.has(n.rollout_id))) this.held = undefined;
  }
}

/**
 * What a failed install that left state held answers: never a restore refusal code (a kind hook may
 * throw one after installing part of its records), which the coordinator takes for "nothing
 * installed" and so would not retire attempt+1 here. Other failures keep their code.
 */
export function heldStateFailure(error: unknown): unknown {
  const failure = toCheckpointError(error);
  if (!RESTORE_REFUSALS.has(failure.code)) return error;
  return new CheckpointError("internal_error", `the install failed after installing part of the restore, which is held here as attempt+1 (${failure.code}: ${failure.message})`, { cause: error });
}
