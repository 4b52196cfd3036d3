import { jetstream, jetstreamManager, RetentionPolicy, StorageType, type StreamConfig } from "@nats-io/jetstream";
import { Bucket, Kvm, type KV } from "@nats-io/kv";
import { nanos, type NatsConnection } from "@nats-io/transport-node";
import { awaitBucketStore, CheckpointError, kvReplicas, MAX_CONTROL_MESSAGE_BYTES } from "../../protocol/index.js";

export interface BucketOptions {
  history: number;
  /** Bucket-level TTL (stream max_age) in ms; 0 = keep forever. */
  ttl: number;
  /**
   * Called before a longer TTL found on the bucket is shortened in place (with the bucket and that
   * TTL); throwing keeps it. Shortening expires live keys at once, under holders renewing on the
   * longer schedule: the leader lease refuses it while a leader holds its key. Called again after
   * the update: a holder may have come between the check and the update (a coordinator winning the
   * lease under the longer TTL), so a refusal then restores the longer TTL before it is thrown.
   */
  beforeShortening?: (kv: KV, foundTtl: number) => Promise<void>;
  /**
   * How keys leave this bucket besides delete markers: "stream" by a JetStream purge of the stream
   * (the leader lease moving its revisions past the epochs in use), "keys" by `kv.purge` too, a
   * rollup message (the decision journal's removals). Both need purges allowed (`deny_purge` off,
   * which a stream never takes back); unset, the bucket is never purged (the members).
   */
  purges?: "stream" | "keys";
  /** How long each JetStream request of the returned bucket waits for its answer; nats.js' default (5 s) when not given. */
  requestTimeoutMs?: number;
}

/**
 * What breaks us in a bucket's stream config that no update can change: a bucket pre-created by
 * hand (`nats kv add`, `nats stream add`) or by other tools. Empty when none. `deny_delete` is
 * fine (`nats kv add` sets it): it refuses the message-delete API alone, which nothing here uses.
 */
function unchangeableFaults(config: StreamConfig, options: BucketOptions): string[] {
  const faults: string[] = [];
  // Gone after a NATS restart: the journal's decisions with it, and the leader bucket comes back
  // restarting its revisions, so participants refuse every epoch (stale_epoch).
  if (config.storage !== StorageType.File) faults.push(`is kept in ${config.storage} storage, which a NATS restart loses`);
  // Interest or work-queue retention drops a message nobody consumes: keys would vanish.
  if (config.retention !== RetentionPolicy.Limits) faults.push(`keeps messages by ${config.retention} retention, which drops keys nobody consumes`);
  if (config.sealed) faults.push("is sealed, which refuses every write and cannot be undone");
  // Its keys are another bucket's (nats.js writes through to it): a lease or journal shared with whoever owns that one.
  if (config.mirror) faults.push(`mirrors stream ${config.mirror.name}, so its keys are written there`);
  // Other streams' messages land in it (maybe already did): another deployment's lease or entries read as ours.
  if (config.sources?.length) faults.push(`takes in the messages of stream(s) ${config.sources.map((s) => s.name).join(", ")}, which read as its own keys`);
  // Subjects besides its keys' are stored and readable by whoever may read the bucket: the members
  // bucket is created by whichever process starts first, a Gym server too, whose NATS user could
  // so keep the controllers' requests (their bearer token) or another role's replies. Only a
  // deletion drops what it already took in.
  const keys = `$KV.${config.name.replace(/^KV_/, "")}.>`;
  const extra = (config.subjects ?? []).filter((subject) => subject !== keys);
  if (extra.length) faults.push(`also takes in subject(s) ${extra.join(", ")} (not its keys, ${keys}), which anyone reading the bucket reads`);
  if (options.purges && config.deny_purge) {
    faults.push(`has deny_purge set, which refuses the purges gym-ckpt makes in it (${options.purges === "keys" ? "removing its entries" : "moving its revisions past the epochs in use"})`);
  }
  return faults;
}

/**
 * The settings an update corrects without losing a key, as they must be: no message or byte limit
 * (reached, it drops the oldest keys, discard old, or refuses writes, discard new: a journal
 * decision must never be dropped, a lease renewal or member heartbeat never refused), a message
 * size limit at least a control message (every value we write fits one: a journal entry is the
 * largest), no per-subject discard (it refuses every rewrite of a key), acknowledged writes (a KV
 * write waits for its ack), and rollups where `kv.purge` removes keys (elsewhere left as found: a
 * deny_purge members bucket cannot allow them).
 */
function correctedLimits(config: StreamConfig, options: BucketOptions): Partial<StreamConfig> {
  const sizeFits = config.max_msg_size <= 0 || config.max_msg_size >= MAX_CONTROL_MESSAGE_BYTES;
  return {
    max_msgs: -1,
    max_bytes: -1,
    max_msg_size: sizeFits ? config.max_msg_size : -1,
    discard_new_per_subject: false,
    no_ack: false,
    allow_rollup_hdrs: options.purges === "keys" || config.allow_rollup_hdrs,
  };
}

/** The settings of `correctedLimits` that `config` does not hold yet, as `name found`; empty when none. */
function limitsOff(config: StreamConfig, options: BucketOptions): string[] {
  const wanted = correctedLimits(config, options);
  // nats-server leaves false flags out of the config it returns.
  const found: Partial<StreamConfig> = { ...config, discard_new_per_subject: config.discard_new_per_subject ?? false, no_ack: config.no_ack ?? false };
  return (Object.keys(wanted) as (keyof typeof wanted)[]).filter((key) => found[key] !== wanted[key]).map((key) => `${key} ${String(found[key])}`);
}

/**
 * Opens a KV bucket, creating it with `options` if missing, then reads the stream config back.
 * nats-server 2.9 silently ignores options it does not know (per-key TTL, markers), and an existing
 * bucket keeps the config it was created with (e.g. the leader bucket after `lease_ms` changed), so
 * reading back is the only way to know the lifetimes we rely on hold. A differing bucket is
 * updated in place, never recreated: a recreated stream restarts its sequence, and the leader
 * epoch (a revision) would fall below what participants have seen, so they would refuse it. The
 * replicas follow `kvReplicas` (a bucket created R1 before the cluster grew is scaled up in place,
 * never down). Settings a bucket pre-created by hand may carry are checked too: limits are lifted
 * in place (`correctedLimits`), what no update can change is refused (`unchangeableFaults`).
 */
export async function openBucketAsserted(nc: NatsConnection, name: string, options: BucketOptions): Promise<KV> {
  const replicas = kvReplicas(nc.info);
  const js = options.requestTimeoutMs === undefined ? nc : jetstream(nc, { timeout: options.requestTimeoutMs });
  const kv = await new Kvm(js).create(name, { history: options.history, replicas, ...(options.ttl > 0 ? { ttl: options.ttl } : {}) });
  // Another process may be creating the bucket this moment; its keys are read at the stream's leader.
  await awaitBucketStore(nc, name);
  const matches = async () => {
    const status = await kv.status();
    // More replicas than the rule asks for are kept: never scaled down (say by a start during an outage).
    const limits = limitsOff(status.streamInfo.config, options);
    return { ok: status.history === options.history && status.ttl === options.ttl && status.replicas >= replicas && limits.length === 0, status, limits };
  };
  let check = await matches();
  // A bucket someone created in memory (`nats kv add --storage memory`), sealed, mirroring... None
  // of it can be changed in place: configuration, refused before anything is written.
  const faults = unchangeableFaults(check.status.streamInfo.config, options);
  if (faults.length > 0) {
    throw new CheckpointError(
      "invalid_request",
      `KV bucket ${name} ${faults.join("; ")}. gym-ckpt does not change that in place: delete it (stream KV_${name}) while no coordinator or participant runs, and start again to have it created on file storage with the settings gym-ckpt needs`,
    );
  }
  if (!check.ok) {
    const found = check.status.ttl;
    const guardShortening = options.ttl > 0 && (found === 0 || found > options.ttl) ? options.beforeShortening : undefined;
    await guardShortening?.(kv, found);
    const jsm = await jetstreamManager(nc);
    const updateLifetime = (ttl: number) =>
      jsm.streams.update(`KV_${name}`, {
        max_msgs_per_subject: options.history,
        max_age: nanos(ttl),
        // The duplicate window may not exceed max_age (the KV client sets it the same way on create).
        duplicate_window: nanos(ttl > 0 ? Math.min(ttl, 120_000) : 120_000),
        num_replicas: Math.max(replicas, check.status.replicas),
        // A bucket pre-created by hand or by other tools may carry limits that break us: lifted.
        ...correctedLimits(check.status.streamInfo.config, options),
      });
    await updateLifetime(options.ttl);
    if (guardShortening) {
      // Within milliseconds of the update, before a key written under the longer TTL ages past the shorter.
      await guardShortening(kv, found).catch(async (refusal: unknown) => {
        await updateLifetime(found);
        throw refusal;
      });
    }
    check = await matches();
  }
  if (!check.ok) {
    throw new CheckpointError(
      "internal_error",
      `KV bucket ${name} has history ${check.status.history}, ttl ${check.status.ttl} ms and ${check.status.replicas} replica(s)${check.limits.map((off) => `, ${off}`).join("")}, and the server kept it so after an update; expected history ${options.history}, ttl ${options.ttl} ms and ${replicas} replica(s), without message or byte limits, rollups allowed where keys are purged.`,
    );
  }
  return kv;
}

/**
 * Has `kv` read through the stream's leader (STREAM.MSG.GET) instead of a direct get, which any
 * replica of an R3 bucket answers, one that lags included: for reads a decision rests on (the
 * journal's entries, whether a leader holds the lease). Writes are unaffected.
 */
export function readsFromStreamLeader(kv: KV): KV {
  if (kv instanceof Bucket) kv.direct = false;
  return kv;
}
