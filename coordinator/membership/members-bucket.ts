import type { KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { MEMBER_TTL_MS, membersBucket } from "../../protocol/index.js";
import { openBucketAsserted, type BucketOptions } from "./kv-bucket.js";

/** The exact options of the membership bucket; participants open it with the same ones. */
export const MEMBERS_BUCKET_OPTIONS: BucketOptions = { history: 1, ttl: MEMBER_TTL_MS };

/** Opens (or creates) the deployment's membership registry and asserts its stream config. */
export function openMembersBucket(nc: NatsConnection, deployment: string): Promise<KV> {
  return openBucketAsserted(nc, membersBucket(deployment), MEMBERS_BUCKET_OPTIONS);
}
