import { NoRespondersError, RequestError, TimeoutError, type NatsConnection } from "@nats-io/transport-node";
import { equalJitter } from "./jitter.js";

/** What `awaitBucketStore` learnt of a KV bucket's stream. */
export type BucketStore = "ready" | "missing" | "unprovable";

/** How long a reader waits for a stream being created to get its store; the window is milliseconds. */
export const BUCKET_STORE_WAIT_MS = 2_000;
/** A direct get to a stream without its store is not refused but unanswered: this is how long we listen. */
const PROBE_TIMEOUT_MS = 100;
const RETRY_MS = 20;

/**
 * Waits until a KV bucket's stream has its store, before anything reads it at the stream's leader
 * (STREAM.MSG.GET). nats-server 2.9.10 lists a stream another client is creating before it sets up
 * the stream's store, and a STREAM.MSG.GET that reaches it in that window dereferences the missing
 * store: the server panics and exits (jetstream_api.go:3028). Every process of a fresh deployment
 * opens the same buckets at start-up, so one creating a bucket while another reads it is the
 * normal first start, not a corner case.
 *
 * STREAM.INFO is safe in that window (it reports an empty stream) and tells `missing` (a
 * STREAM.MSG.GET on it is then a plain "not found") and a stream created without direct gets
 * (`unprovable`). Otherwise a direct get is answered only by the subscription the server makes once
 * the store exists, so any answer (the entry or a 404) proves the store is there: `ready`. One left
 * unanswered is asked again until `withinMs` runs out (`unprovable`, as is any other failure): the
 * caller then reads anyway, as it did before this check.
 */
export async function awaitBucketStore(nc: NatsConnection, bucket: string, withinMs = BUCKET_STORE_WAIT_MS, stop?: AbortSignal): Promise<BucketStore> {
  const stream = `KV_${bucket}`;
  // A duration within this process: a wall-clock step must neither end the wait nor stretch it.
  const until = performance.now() + withinMs;
  for (;;) {
    // The caller no longer needs the read: nothing more is sent (see LeaderLeaseReader.leader).
    if (stop?.aborted) return "unprovable";
    const timeout = () => Math.max(1, Math.min(1_000, until - performance.now()));
    const info = await streamInfo(nc, stream, timeout()).catch(() => undefined);
    if (info === "missing") return "missing";
    if (stop?.aborted) return "unprovable";
    if (info === undefined || !info.allowDirect) return "unprovable";
    try {
      // A key nobody writes: the answer is a small 404 once the store is there.
      await nc.request(`$JS.API.DIRECT.GET.${stream}`, JSON.stringify({ last_by_subj: `$KV.${bucket}.gym_ckpt_store_probe` }), { timeout: Math.min(PROBE_TIMEOUT_MS, timeout()) });
      return "ready";
    } catch (error) {
      const unanswered = error instanceof TimeoutError || isNoResponders(error);
      if (!unanswered) return "unprovable";
    }
    const wait = equalJitter(RETRY_MS);
    if (performance.now() + wait >= until) return "unprovable";
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}

async function streamInfo(nc: NatsConnection, stream: string, timeout: number): Promise<"missing" | { allowDirect: boolean }> {
  const reply = (await nc.request(`$JS.API.STREAM.INFO.${stream}`, "", { timeout })).json<{
    error?: { err_code?: number };
    config?: { allow_direct?: boolean };
  }>();
  // 10059: stream not found.
  if (reply.error?.err_code === 10059) return "missing";
  if (reply.error) throw new Error(`STREAM.INFO ${stream} refused`);
  return { allowDirect: reply.config?.allow_direct === true };
}

export function isNoResponders(error: unknown): boolean {
  return error instanceof NoRespondersError || (error instanceof RequestError && error.isNoResponders());
}
