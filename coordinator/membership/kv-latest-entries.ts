import { Bucket, type KV, type KvEntry } from "@nats-io/kv";

/** Gets in flight at once while reading a bucket's keys. */
const PARALLEL_GETS = 32;

/**
 * The latest entry of every key in a KV bucket, delete and purge markers included: the bucket's
 * subjects read in one stream-info request (a server-side snapshot), then one get per key.
 *
 * Not `kv.keys()` or `kv.history()`: those run an ordered consumer, and messages leaving the
 * stream while it delivers move it past keys it had not delivered yet. A filtered purge (the
 * journal's marker compaction) stalled a listing for 30 s about one time in four, and once it came
 * back without live entries; an expiry (the membership bucket's max_age) left out a key written
 * moments before. A key removed between the snapshot and its get is left out here, as it should be.
 */
export async function latestEntries(kv: KV): Promise<KvEntry[]> {
  // Kvm opens every bucket as a Bucket; its stream and subject prefix are what the snapshot needs.
  if (!(kv instanceof Bucket)) throw new TypeError("latestEntries reads a bucket opened with Kvm");
  const info = await kv.jsm.streams.info(kv.stream, { subjects_filter: `${kv.prefix}.>` });
  const keys = Object.keys(info.state.subjects ?? {}).map((subject) => kv.decodeKey(subject.substring(kv.prefixLen)));
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
