import { CheckpointError } from "../../protocol/index.js";

export interface LeadershipState {
  id: string;
  leader: boolean;
  /** Leader and past the first lease period: allowed to send phase messages. */
  ready: boolean;
  epoch: number | null;
  /**
   * The term held serves the controller API (marked once recovered and subscribed), ready or not
   * now (a renewal lapsed, a stop under way). Absent where unknown (StaticLeadership): taken as not.
   */
  serving?: boolean;
}

/** What the engine asks before every phase message. */
export interface Leadership {
  /** The epoch to carry; throws `not_leader` unless this coordinator may send phase messages. */
  epoch(): number;
  /** Throws `not_leader` when the epoch changed or leadership was lost since `epoch` was taken. */
  assert(epoch: number): void;
  state(): LeadershipState;
  /** Why no coordinator of this version leads, when the lease is seen held by one of another protocol version (see `leaderOfOtherVersion`). */
  leaderOfOtherVersion(): string | undefined;
}

/** A fixed epoch: for a single coordinator in tests and tools that need no election. */
export class StaticLeadership implements Leadership {
  private active = true;
  constructor(
    private readonly fixedEpoch: number,
    private readonly id = "static",
  ) {}
  epoch(): number {
    if (!this.active) throw new CheckpointError("not_leader", "this coordinator was demoted");
    return this.fixedEpoch;
  }
  assert(epoch: number): void {
    if (!this.active || epoch !== this.fixedEpoch) throw new CheckpointError("not_leader", "this coordinator was demoted");
  }
  demote(): void {
    this.active = false;
  }
  state(): LeadershipState {
    return { id: this.id, leader: this.active, ready: this.active, epoch: this.active ? this.fixedEpoch : null };
  }
  leaderOfOtherVersion(): string | undefined {
    return undefined;
  }
}
