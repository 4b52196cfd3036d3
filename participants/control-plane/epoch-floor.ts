import { JetStreamApiCodes } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { awaitBucketStore, LEADER_KEY, leaderBucket, leaseEpochFloor, leaseIssuedEpoch, within } from "../../protocol/index.js";

/** How long start-up waits for the leader bucket before it starts unfenced. */
export const EPOCH_FLOOR_READ_MS = 2_000;
/** The bound of one issued-epoch read: inside a new leader's recovery probe's 2 s status wait. */
export const EPOCH_ISSUED_READ_MS = 1_000;

type LeaseState = { lastSeq: number; held: { revision: number; value: string } | null };

/**
 * The leader bucket's last sequence, then its key (in that order: a key created after the read lies
 * past it). open() binds without direct gets (the stream's leader answers, never a lagging replica)
 * and without reading the stream: status() is the first request to it. Throws StreamNotFound when
 * no coordinator ever ran here.
 */
async function readLease(nc: NatsConnection, deployment: string): Promise<LeaseState> {
  const kv = await new Kvm(nc).open(leaderBucket(deployment));
  const lastSeq = (await kv.status()).streamInfo.state.last_seq;
  const entry = await kv.get(LEADER_KEY);
  return { lastSeq, held: entry?.operation === "PUT" ? { revision: entry.revision, value: entry.string() } : null };
}

const neverRan = (error: unknown) => (error as { code?: unknown }).code === JetStreamApiCodes.StreamNotFound;

/**
 * The epoch fence a participant starts from, read from the leader lease before it subscribes: the
 * highest epoch seen lives in memory, so a restarted process would otherwise admit a deposed
 * leader's delayed restore, retire or forget (see leaseEpochFloor). 0 when no coordinator ever
 * ran (no bucket) or the bucket cannot be read in time (logged): the process then starts
 * unfenced until a leader's status probe or first op raises the fence. Never throws.
 */
export async function readEpochFloor(nc: NatsConnection, deployment: string, logger?: Logger, withinMs = EPOCH_FLOOR_READ_MS): Promise<number> {
  try {
    const read = (async () => {
      // A coordinator may be creating the bucket this moment (see awaitBucketStore).
      if ((await awaitBucketStore(nc, leaderBucket(deployment), withinMs)) === "missing") return 0; // no coordinator ever ran here
      const { lastSeq, held } = await readLease(nc, deployment);
      return leaseEpochFloor(lastSeq, held);
    })();
    const floor = await within(read, withinMs);
    if (floor > 0) logger?.info({ epoch_floor: floor }, "epoch fence raised from the leader lease");
    return floor;
  } catch (error) {
    if (neverRan(error)) return 0;
    logger?.warn({ err: error }, "leader lease unread: starting without an epoch fence, a deposed leader's delayed op is admitted until a leader's first message");
    return 0;
  }
}

/**
 * Whether the leader lease has issued `epoch` (see leaseIssuedEpoch): asked by the control plane
 * before an epoch above any it has seen may raise its fence, so a message forged with the
 * participants' token cannot fence out the sitting leader (at 2^53 - 1, every leader for good).
 * True when it cannot be told: no bucket (no coordinator ever ran: nothing to fence), a value
 * naming no epoch, or a failed read (logged): availability over a check only a forger fails.
 */
export async function leaseIssued(nc: NatsConnection, deployment: string, epoch: number, logger?: Logger, withinMs = EPOCH_ISSUED_READ_MS): Promise<boolean> {
  try {
    const { lastSeq, held } = await within(readLease(nc, deployment), withinMs);
    const issued = leaseIssuedEpoch(lastSeq, held);
    return issued === undefined || epoch <= issued;
  } catch (error) {
    if (!neverRan(error)) logger?.warn({ err: error, epoch }, "leader lease unread: an epoch above the highest seen is admitted unchecked");
    return true;
  }
}
