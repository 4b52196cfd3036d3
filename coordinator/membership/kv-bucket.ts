import { Kvm, type KV } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";
import { CheckpointError } from "../../protocol/index.js";

export interface BucketOptions {
  history: number;
  /** Bucket-level TTL (stream max_age) in ms; 0 = keep forever. */
  ttl: number;
}

/**
 * Opens a KV bucket, creating it with `options` if missing, then reads the stream config back and
 * refuses to continue when it differs. nats-server 2.9 silently ignores options it does not know
 * (per-key TTL, markers), and an existing bucket keeps the config it was created with, so the
 * assertion is the only way to know the lifetimes we rely on hold.
 */
export async function openBucketAsserted(nc: NatsConnection, name: string, options: BucketOptions): Promise<KV> {
  const kv = await new Kvm(nc).create(name, { history: options.history, ...(options.ttl > 0 ? { ttl: options.ttl } : {}) });
  const status = await kv.status();
  if (status.history !== options.history || status.ttl !== options.ttl) {
    throw new CheckpointError(
      "internal_error",
      `KV bucket ${name} has history ${status.history} and ttl ${status.ttl} ms; expected history ${options.history} and ttl ${options.ttl} ms. ` +
        `Delete the bucket (nats kv del ${name}) so it is recreated with the right config.`,
    );
  }
  return kv;
}
