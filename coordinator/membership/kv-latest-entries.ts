import { jetstreamManager } from "@nats-io/jetstream";
import type { KV, KvEntry } from "@nats-io/kv";
import type { NatsConnection } from "@nats-io/transport-node";

/** Gets in flight at once while reading a bucket's keys. */
const PARALLEL_GETS = 32;

/**
 * The latest entry of every key in a KV bucket, delete and purge markers included: the bucket's
 * subjects read in one stream-info request (a server-side snapshot), then one get per key.
 *
 * Not `kv.keys()` or `kv.history()`: those run an ordered consumer, and a filtered purge landing
 * while it delivers (the journal's marker compaction, in this or a deposed coordinator) moves the
 * consumer past keys it had not yet delivered, so the listing stalled for 30 s or came back
 * without live entries. A key removed between the snapshot and its get is left out.
 */
export async function latestEntries(nc: NatsConnection, bucket: string, kv: KV): Promise<KvEntry[]> {
  const prefix = `$KV.${bucket}.`;
  const info = await (await jetstreamManager(nc)).streams.info(`KV_${bucket}`, { subjects_filter: `${prefix}>` });
  const keys = Object.keys(info.state.subjects ?? {}).map((subject) => subject.slice(prefix.length));
  const entries: KvEntry[] = [];
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < keys.length) {
      const entry = await kv.get(keys[next++]!);
      if (entry) entries.push(entry);
    }
  };
  await Promise.all(Array.from({ length: Math.min(PARALLEL_GETS, keys.length) }, worker));
  return entries;
}
