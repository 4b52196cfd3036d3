import { JetStreamApiCodes } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { awaitBucketStore, LEADER_KEY, leaderBucket, leaseEpochFloor, within } from "../../protocol/index.js";

/** How long start-up waits for the leader bucket before it starts unfenced. */
export const EPOCH_FLOOR_READ_MS = 2_000;

/**
 * The epoch fence a participant starts from, read from the leader lease before it subscribes: the
 * highest epoch seen lives in memory, so a restarted process would otherwise admit a deposed
 * leader's delayed restore, retire or forget (see leaseEpochFloor). 0 when no coordinator ever
 * ran (no bucket) or the bucket cannot be read in time (logged): the process then starts
 * unfenced, as before, until a leader's status probe or first op raises the fence. Never throws.
 */
export async function readEpochFloor(nc: NatsConnection, deployment: string, logger?: Logger, withinMs = EPOCH_FLOOR_READ_MS): Promise<number> {
  try {
    const read = (async () => {
      // open() binds without direct gets (the stream's leader answers, never a lagging replica) and
      // without reading the stream: status() below is the first request to it.
      const bucket = leaderBucket(deployment);
      // A coordinator may be creating the bucket this moment (see awaitBucketStore).
      if ((await awaitBucketStore(nc, bucket, withinMs)) === "missing") return 0; // no coordinator ever ran here
      const kv = await new Kvm(nc).open(bucket);
      // The last sequence first: a key created after it lies past it (see leaseEpochFloor).
      const lastSeq = (await kv.status()).streamInfo.state.last_seq;
      const entry = await kv.get(LEADER_KEY);
      return leaseEpochFloor(lastSeq, entry?.operation === "PUT" ? { revision: entry.revision, value: entry.string() } : null);
    })();
    const floor = await within(read, withinMs);
    if (floor > 0) logger?.info({ epoch_floor: floor }, "epoch fence raised from the leader lease");
    return floor;
  } catch (error) {
    if ((error as { code?: unknown }).code === JetStreamApiCodes.StreamNotFound) return 0; // no coordinator ever ran here
    logger?.warn({ err: error }, "leader lease unread: starting without an epoch fence, a deposed leader's delayed op is admitted until a leader's first message");
    return 0;
  }
}
