import { Kvm, type KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { CheckpointError, leaderBucket } from "../../protocol/index.js";
import { LEADER_KEY } from "../ha/leader-lease.js";
import { pollUntil } from "./poll-until.js";

/** How often a waiting client re-reads the leader lease (a few lease periods at the defaults). */
export const LEADER_CHECK_MS = 5_000;

/**
 * The coordinator leading `deployment`, as its lease in the leader bucket names it: its id, null
 * when nobody leads, undefined when the lease cannot be read (no JetStream permissions, a timeout).
 */
export class LeaderLeaseReader {
  private kv: KV | undefined;

  constructor(
    private readonly nc: NatsConnection,
    private readonly deployment: string,
  ) {}

  async leader(): Promise<string | null | undefined> {
    try {
      // open() binds without direct gets, so reads ask the stream's leader, never a lagging replica.
      this.kv ??= await new Kvm(this.nc).open(leaderBucket(this.deployment));
      const entry = await this.kv.get(LEADER_KEY);
      if (!entry || entry.operation !== "PUT") return null;
      const id = (JSON.parse(entry.string()) as { id?: unknown }).id;
      return typeof id === "string" ? id : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Resolves with `outcome_unknown` once the lease no longer names `leader` (it stopped leading:
   * killed, partitioned, demoted), re-read every `everyMs` until `stop` aborts. An op without a
   * deadline may legitimately run as long as the coordinator's default timeout, which a client does
   * not know; without this, a client whose coordinator died would wait for the 7-day cap.
   */
  lost(leader: string, everyMs: number, stop: AbortSignal): Promise<CheckpointError> {
    return pollUntil(
      async () => {
        const now = await this.leader();
        // Unreadable (undefined): checked again next time, never taken for a loss.
        if (now === undefined || now === leader) return undefined;
        return new CheckpointError("outcome_unknown", `coordinator ${leader} stopped leading before it answered (${now === null ? "nobody leads now" : `${now} leads now`}); retry the op to learn its outcome`);
      },
      everyMs,
      stop,
      "later",
    );
  }
}
