import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DiscardPolicy, jetstreamManager, RetentionPolicy, StorageType, type JetStreamManager, type StreamConfig } from "@nats-io/jetstream";
import { Kvm, type KV } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CoordinatorConfigSchema } from "../../coordinator/config/coordinator-config.js";
import { startCoordinator } from "../../coordinator/daemon/coordinator-daemon.js";
import { openBucketAsserted, type BucketOptions } from "../../coordinator/membership/kv-bucket.js";
import { MEMBERS_BUCKET_OPTIONS } from "../../coordinator/membership/members-bucket.js";
import { createLogger } from "../../coordinator/telemetry/logger.js";
import { MAX_JOURNAL_ENTRY_BYTES } from "../../coordinator/ha/decision-journal.js";
import { journalBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { refusalOf } from "../support/refusal.js";

/**
 * A bucket an operator pre-created by hand (`nats kv add`, `nats stream add`) or with other tools
 * may carry stream settings that break the coordinator later (writes refused, keys dropped, purges
 * refused). Start-up checks them (`openBucketAsserted`): it corrects in place what can be without
 * losing keys and refuses, `invalid_request` (exit 2), what cannot.
 */
let nats: NatsFixture;
let jsm: JetStreamManager;
let root: string;
beforeAll(async () => {
  nats = await startNats();
  jsm = await jetstreamManager(nats.nc);
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-bucketcfg-"));
  await handMade("cfg_origin", {}); // another bucket, mirrored or sourced below
});
afterAll(async () => {
  await nats?.close();
  if (root) await rm(root, { recursive: true, force: true });
});

const JOURNAL: BucketOptions = { history: 1, ttl: 0, purges: "keys" };
const LEADER: BucketOptions = { history: 1, ttl: 3_000, purges: "stream" };

/** A file-storage KV stream as `Kvm.create` would make it, with `config` over it. */
async function handMade(name: string, config: Partial<StreamConfig>): Promise<void> {
  await jsm.streams.add({
    name: `KV_${name}`,
    subjects: [`$KV.${name}.>`],
    max_msgs_per_subject: 1,
    storage: StorageType.File,
    allow_rollup_hdrs: true,
    ...config,
  });
}

describe("a pre-created bucket with settings that cannot change in place", () => {
  it.each([
    { setting: "sealed", bucket: "cfg_sealed_journal", options: JOURNAL, make: async (name: string) => {
      await handMade(name, {});
      await jsm.streams.update(`KV_${name}`, { sealed: true } as Partial<StreamConfig>);
    }, expected: /sealed/ },
    { setting: "deny_purge (journal)", bucket: "cfg_denypurge_journal", options: JOURNAL, make: (name: string) => handMade(name, { deny_purge: true, allow_rollup_hdrs: false }), expected: /deny_purge/ },
    { setting: "deny_purge (leader)", bucket: "cfg_denypurge_leader", options: LEADER, make: (name: string) => handMade(name, { deny_purge: true, allow_rollup_hdrs: false, max_age: 3_000_000_000 }), expected: /deny_purge/ },
    { setting: "mirror", bucket: "cfg_mirror_journal", options: JOURNAL, make: (name: string) =>
      jsm.streams.add({ name: `KV_${name}`, mirror: { name: "KV_cfg_origin" }, max_msgs_per_subject: 1, storage: StorageType.File }), expected: /mirror.*KV_cfg_origin/ },
    { setting: "sources", bucket: "cfg_sources_journal", options: JOURNAL, make: (name: string) => handMade(name, { sources: [{ name: "KV_cfg_origin" }] }), expected: /sources.*KV_cfg_origin/ },
    // A Gym server's NATS user may create the members bucket (it may start first) and so name its subjects.
    { setting: "subjects besides its keys'", bucket: "cfg_capture_members", options: MEMBERS_BUCKET_OPTIONS, make: (name: string) =>
      handMade(name, { subjects: [`$KV.${name}.>`, "gym.ckpt.v1.cfg.ctl.>", "_INBOX_cfg_controller.>"], max_age: 15_000_000_000 }), expected: /subject\(s\) gym\.ckpt\.v1\.cfg\.ctl\.>, _INBOX_cfg_controller\.>/ },
    { setting: "interest retention", bucket: "cfg_interest_journal", options: JOURNAL, make: (name: string) => handMade(name, { retention: RetentionPolicy.Interest }), expected: /interest retention/ },
  ])("refuses $setting with invalid_request naming the bucket, the setting and what to do", async ({ bucket, options, make, expected }) => {
    await make(bucket);
    const refused = await refusalOf(openBucketAsserted(nats.nc, bucket, options));
    expect(refused.code).toBe("invalid_request");
    expect(refused.message).toMatch(new RegExp(`KV bucket ${bucket} `));
    expect(refused.message).toMatch(expected);
    expect(refused.message).toMatch(/delete it \(stream KV_/);
  });

  it("accepts deny_delete (`nats kv add` sets it; nothing of ours deletes messages by the API) and deny_purge on the members bucket (never purged)", async () => {
    await handMade("cfg_denydelete_journal", { deny_delete: true });
    const journal = await openBucketAsserted(nats.nc, "cfg_denydelete_journal", JOURNAL);
    await journal.put("k", "v");
    await journal.purge("k"); // the journal's removal: a rollup, which deny_delete allows
    await handMade("cfg_denypurge_members", { deny_purge: true, deny_delete: true, allow_rollup_hdrs: false, max_age: 15_000_000_000 });
    const members = await openBucketAsserted(nats.nc, "cfg_denypurge_members", MEMBERS_BUCKET_OPTIONS);
    await members.put("k", "v");
    await members.delete("k"); // a participant's stop: a delete marker
  });

  it("the coordinator does not start on a sealed journal bucket (invalid_request: exit 2)", async () => {
    const name = journalBucket("cfgsealed");
    await handMade(name, {});
    await jsm.streams.update(`KV_${name}`, { sealed: true } as Partial<StreamConfig>);
    const config = CoordinatorConfigSchema.parse({
      deployment: "cfgsealed",
      nats: { servers: nats.server.url },
      token: "cfg-token",
      checkpoint_root: join(root, "ckpt"),
      lease_ms: 1000,
      http: { enabled: false },
    });
    const refused = await refusalOf(async () => {
      const coordinator = await startCoordinator({ config, logger: createLogger("silent") });
      await coordinator.stop(); // started after all: stopped before the test fails
    });
    expect(refused.code).toBe("invalid_request");
    expect(refused.message).toMatch(/sealed/);
  });
});

describe("a pre-created bucket with settings an update corrects without losing a key", () => {
  it.each([
    {
      setting: "max_msgs with discard old (the oldest keys dropped: a journal decision lost)",
      bucket: "cfg_maxmsgs_journal",
      options: JOURNAL,
      config: { max_msgs: 2, discard: DiscardPolicy.Old },
      works: async (kv: KV): Promise<void> => {
        for (const key of ["a", "b", "c"]) await kv.put(key, "v");
        expect((await kv.get("kept"))?.string()).toBe("before");
      },
    },
    {
      setting: "max_bytes with discard new (writes refused once full: the lease not renewed)",
      bucket: "cfg_maxbytes_leader",
      options: LEADER,
      config: { max_bytes: 1024, discard: DiscardPolicy.New, max_age: 3_000_000_000 },
      works: async (kv: KV): Promise<void> => {
        await kv.put("big", "x".repeat(4096));
      },
    },
    {
      setting: "max_msg_size below a journal entry",
      bucket: "cfg_msgsize_journal",
      options: JOURNAL,
      config: { max_msg_size: 1024 },
      works: async (kv: KV): Promise<void> => {
        await kv.put("big", "x".repeat(MAX_JOURNAL_ENTRY_BYTES));
      },
    },
    {
      setting: "discard_new_per_subject (every rewrite of a key refused)",
      bucket: "cfg_pernew_members",
      options: MEMBERS_BUCKET_OPTIONS,
      config: { discard: DiscardPolicy.New, discard_new_per_subject: true, max_age: 15_000_000_000 },
      works: async (kv: KV): Promise<void> => {
        await kv.put("kept", "after");
      },
    },
    {
      setting: "allow_rollup_hdrs off (the journal's kv.purge refused)",
      bucket: "cfg_norollup_journal",
      options: JOURNAL,
      config: { allow_rollup_hdrs: false },
      works: async (kv: KV): Promise<void> => {
        await kv.purge("kept");
      },
    },
  ])("corrects $setting in place, keeping its keys and revisions", async ({ bucket, options, config, works }) => {
    await handMade(bucket, config);
    const before = await (await new Kvm(nats.nc).open(bucket)).put("kept", "before");
    const kv = await openBucketAsserted(nats.nc, bucket, options);
    const corrected = (await jsm.streams.info(`KV_${bucket}`)).config;
    expect({
      max_msgs: corrected.max_msgs,
      max_bytes: corrected.max_bytes,
      max_msg_size: corrected.max_msg_size,
      discard_new_per_subject: corrected.discard_new_per_subject ?? false,
      allow_rollup_hdrs: corrected.allow_rollup_hdrs,
    }).toEqual({ max_msgs: -1, max_bytes: -1, max_msg_size: -1, discard_new_per_subject: false, allow_rollup_hdrs: true });
    expect((await kv.get("kept"))?.revision).toBe(before);
    await works(kv);
  });

  it("corrects no_ack (every KV write would time out unanswered), and keeps a message size limit above our largest value", async () => {
    await handMade("cfg_noack_journal", { no_ack: true, max_msg_size: 8 * 1024 * 1024 });
    const kv = await openBucketAsserted(nats.nc, "cfg_noack_journal", JOURNAL);
    const corrected = (await jsm.streams.info("KV_cfg_noack_journal")).config;
    expect({ no_ack: corrected.no_ack ?? false, max_msg_size: corrected.max_msg_size }).toEqual({ no_ack: false, max_msg_size: 8 * 1024 * 1024 });
    expect(await kv.put("k", "v")).toBe(1);
  });

  it("leaves rollups off where nothing purges keys (the leader, the members): a deny_purge stream cannot allow them", async () => {
    await handMade("cfg_norollup_leader", { allow_rollup_hdrs: false, max_age: 3_000_000_000 });
    await openBucketAsserted(nats.nc, "cfg_norollup_leader", LEADER);
    expect((await jsm.streams.info("KV_cfg_norollup_leader")).config.allow_rollup_hdrs).toBe(false);
  });
});
