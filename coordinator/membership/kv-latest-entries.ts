import { Bucket, type KV, type KvEntry } from "@nats-io/kv";
import { errors } from "@nats-io/transport-node";

/** Gets in flight at once while reading a bucket's keys. */
const PARALLEL_GETS = 32;

/** A key left out because no KV client can read it, with why: the caller logs it. */
export type UnreadableKey = (key: string, error: Error) => void;

/**
 * The latest entry of every key in a KV bucket, delete and purge markers included: the bucket's
 * subjects read in one stream-info request (a server-side snapshot), then one get per key.
 *
 * Not `kv.keys()` or `kv.history()`: those run an ordered consumer, and messages leaving the
 * stream while it delivers move it past keys it had not delivered yet. A filtered purge (the
 * journal's marker compaction) stalled a listing for 30 s about one time in four, and once it came
 * back without live entries; an expiry (the membership bucket's max_age) left out a key written
 * moments before. A key removed between the snapshot and its get is left out here, as it should be.
 *
 * A message nothing here wrote, which any client allowed to publish on the bucket's subjects can
 * store, is left out and passed to `unreadable` instead of failing the whole listing (and with it
 * every recovery, or the coordinator's start): a subject that is no valid KV key (`a@b`), which
 * nats.js refuses to get, or a header block nats.js cannot decode (a name with a space).
 */
export async function latestEntries(kv: KV, unreadable?: UnreadableKey): Promise<KvEntry[]> {
  // Kvm opens every bucket as a Bucket; its stream and subject prefix are what the snapshot needs.
  if (!(kv instanceof Bucket)) throw new TypeError("latestEntries reads a bucket opened with Kvm");
  const info = await kv.jsm.streams.info(kv.stream, { subjects_filter: `${kv.prefix}.>` });
  const keys = Object.keys(info.state.subjects ?? {}).map((subject) => kv.decodeKey(subject.substring(kv.prefixLen)));
  const entries: KvEntry[] = [];
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < keys.length) {
      const key = keys[next++]!;
      let entry: KvEntry | null;
      try {
        entry = await kv.get(key); // validates the key first
        // Decoded lazily by some paths: read here, where a failure is this key's alone.
        void entry?.operation;
      } catch (error) {
        if (!isUnreadable(error)) throw error;
        unreadable?.(key, error as Error);
        continue;
      }
      if (entry) entries.push(entry);
    }
  };
  await Promise.all(Array.from({ length: Math.min(PARALLEL_GETS, keys.length) }, worker));
  return entries;
}

/** A message's own fault (its key or headers), not the server's or the connection's. */
function isUnreadable(error: unknown): boolean {
  if (error instanceof errors.InvalidArgumentError) return true; // header block nats.js cannot decode
  return error instanceof Error && error.message.startsWith("invalid key:"); // nats.js validateKey
}
