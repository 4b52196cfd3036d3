import { describe, expect, it } from "vitest";
import { validateKey } from "@nats-io/kv/internal";
import {
  CheckpointIdSchema,
  EpisodeIdSchema,
  InstanceSchema,
  RolloutIdSchema,
  captureKey,
  nextAttempt,
  parseCaptureKey,
} from "../../../protocol/index.js";
import { RESERVED_CHECKPOINT_IDS } from "../../../protocol/ids.js";
import { ROLLOUTS_DIR } from "../../../protocol/rollout-records.js";
import { COLLECTOR_LOCK_FILE } from "../../../coordinator/collect/collector-lock.js";
import { DISPATCH_LOG_FILE } from "../../../coordinator/collect/dispatch-log.js";

describe("ids and capture keys", () => {
  it("uses the bare rollout id for attempt 0 and -a<N> after", () => {
    expect(captureKey({ rollout_id: "r1", attempt: 0 })).toBe("r1");
    expect(captureKey({ rollout_id: "counter-1", attempt: 1 })).toBe("counter-1-a1");
    expect(captureKey(nextAttempt({ rollout_id: "x.y_z", attempt: 41 }))).toBe("x.y_z-a42");
  });

  it("reverses every key it produces", () => {
    for (const episode of [
      { rollout_id: "r", attempt: 0 },
      { rollout_id: "a-b-c", attempt: 3 },
      { rollout_id: "task.9", attempt: 120 },
    ]) {
      expect(parseCaptureKey(captureKey(episode))).toEqual(episode);
    }
  });

  it("refuses non-canonical keys", () => {
    expect(parseCaptureKey("r-a0")).toBeUndefined();
    expect(parseCaptureKey("r-a01")).toBeUndefined();
    expect(parseCaptureKey("../etc")).toBeUndefined();
    expect(parseCaptureKey("")).toBeUndefined();
  });

  it("parses exactly what EpisodeIdSchema accepts (its fast path checks the schema's rules itself)", () => {
    const viaSchema = (key: string) => {
      const match = /^(.+)-a([1-9]\d*)$/.exec(key);
      const parsed = EpisodeIdSchema.safeParse(match ? { rollout_id: match[1], attempt: Number(match[2]) } : { rollout_id: key, attempt: 0 });
      return parsed.success ? parsed.data : undefined;
    };
    const keys = ["r", "r-a1", "r-a0", "r-a01", "r-a1000000", "r-a1000001", "r-a99999999999999999999", "x".repeat(200), "x".repeat(201), `${"x".repeat(200)}-a2`];
    keys.push("-r", ".r", "r/", "r b", "r-a1-a2", "job-a3-a1", "a.b_c-d", "ä", "r\n", "r-a", "r-ab1", "0", "-a1", "r--a1");
    for (const key of keys) expect(parseCaptureKey(key), key).toEqual(viaSchema(key));
  });

  it("reserves the -a<digits> suffix in rollout ids", () => {
    expect(RolloutIdSchema.safeParse("job-a3").success).toBe(false);
    expect(RolloutIdSchema.safeParse("job-abc").success).toBe(true);
    expect(RolloutIdSchema.safeParse("-lead").success).toBe(false);
    expect(RolloutIdSchema.safeParse("a/b").success).toBe(false);
  });

  it("validates attempts and rejects unknown fields", () => {
    expect(EpisodeIdSchema.parse({ rollout_id: "r" })).toEqual({ rollout_id: "r", attempt: 0 });
    expect(EpisodeIdSchema.safeParse({ rollout_id: "r", attempt: -1 }).success).toBe(false);
    expect(EpisodeIdSchema.safeParse({ rollout_id: "r", attempt: 1.5 }).success).toBe(false);
    expect(EpisodeIdSchema.safeParse({ rollout_id: "r", attempt: 0, extra: 1 }).success).toBe(false);
  });

  it("bounds checkpoint ids to 1-128 safe characters", () => {
    expect(CheckpointIdSchema.safeParse("ckpt-20261129T072100-0a1b2c3d").success).toBe(true);
    expect(CheckpointIdSchema.safeParse("a".repeat(128)).success).toBe(true);
    expect(CheckpointIdSchema.safeParse("a".repeat(129)).success).toBe(false);
    expect(CheckpointIdSchema.safeParse("..").success).toBe(false);
    // the root's pointer file: a checkpoint directory of that name would break publication
    for (const reserved of ["LATEST", "latest", "Latest"]) expect(CheckpointIdSchema.safeParse(reserved).success).toBe(false);
    expect(CheckpointIdSchema.safeParse("LATEST-1").success).toBe(true);
    // What `gym-ckpt collect` writes at the root (--checkpoint-dir is the root, --records-dir may be):
    // a checkpoint of that name would commit into the collector's records directory (which retention
    // then trashes whole) or take its lock's or dispatch log's path.
    for (const reserved of ["rollouts", "Rollouts", "collector.pid", "COLLECTOR.PID", "dispatched.jsonl"]) {
      expect([reserved, CheckpointIdSchema.safeParse(reserved).success]).toEqual([reserved, false]);
    }
    expect(CheckpointIdSchema.safeParse("rollouts-1").success).toBe(true);
    expect([...RESERVED_CHECKPOINT_IDS].sort()).toEqual(["latest", ROLLOUTS_DIR, COLLECTOR_LOCK_FILE, DISPATCH_LOG_FILE].map((name) => name.toLowerCase()).sort());
    expect(CheckpointIdSchema.safeParse(".hidden").success).toBe(false);
    expect(CheckpointIdSchema.safeParse("a/b").success).toBe(false);
  });

  it("refuses checkpoint ids and instances that would put an empty token into a NATS subject or KV key", () => {
    // A checkpoint id is the decision journal's KV key; an instance is a subject token and part of the
    // membership key. "ckpt." is refused by the KV client ("invalid key"); "a..b" makes an empty
    // subject token that the server routes to nobody (no responders).
    for (const id of ["ckpt.", "a..b", "a...", "x.y..z"]) {
      expect([id, CheckpointIdSchema.safeParse(id).success]).toEqual([id, false]);
      expect([id, InstanceSchema.safeParse(id).success]).toEqual([id, false]);
    }
    for (const id of ["a.b", "env-1.zone_2", "ckpt-20261129T072100-0a1b2c3d"]) {
      expect(CheckpointIdSchema.safeParse(id).success).toBe(true);
      expect(InstanceSchema.safeParse(id).success).toBe(true);
      expect(() => validateKey(id)).not.toThrow();
      expect(() => validateKey(`model.${id}`)).not.toThrow();
    }
  });
});
