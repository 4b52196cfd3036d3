import { describe, expect, it } from "vitest";
import {
  DEFAULT_RECHECK_PROMPT,
  dumpReplayConfig,
  expandGlobs,
  parseReplayConfig,
  recordFilters,
  ReplayError,
  ReplayTaskSource,
} from "../../../participants/replay/index.js";
import { mathSource } from "./fixtures.js";

const base = { records: "runs/*/rollouts/step_*/train_rollouts_gsm8k.jsonl", source: { id: "gsm8k" } };

function refusal(raw: unknown): ReplayError {
  try {
    parseReplayConfig(raw);
  } catch (error) {
    if (error instanceof ReplayError) return error;
    throw error;
  }
  throw new Error("config was accepted");
}

describe("replay config (16)", () => {
  it("keeps a source config key named __proto__ as data, through a dump and a re-parse", () => {
    const raw = JSON.parse(`{"records":"step_*/x.jsonl","source":{"id":"gsm8k","__proto__":{"split":"test"},"k":1}}`) as unknown;
    const config = parseReplayConfig(raw);
    expect(Object.keys(config.source)).toEqual(["id", "__proto__", "k"]);
    expect(Object.getOwnPropertyDescriptor(config.source, "__proto__")?.value).toEqual({ split: "test" });
    expect(Object.getPrototypeOf(config.source)).toBe(Object.prototype);
    expect(JSON.stringify(parseReplayConfig(dumpReplayConfig(config)).source)).toBe(`{"id":"gsm8k","__proto__":{"split":"test"},"k":1}`);
  });

  it("fills defaults", () => {
    expect(parseReplayConfig(base)).toEqual({
      ...base,
      mode: "continue",
      anchor: "compaction",
      max_anchors: 1,
      recheck_prompt: DEFAULT_RECHECK_PROMPT,
      max_seed_tokens: null,
      min_source_reward: null,
      max_source_reward: null,
      seed: 0,
      wait_for_step_marker: false,
      poll_interval_ms: null,
      verify_index_sha256: false,
    });
  });

  it("re-validates a dumped config identically", () => {
    for (const raw of [
      base,
      { ...base, mode: "recheck", max_source_reward: 0.5, source: { id: "gsm8k", split: "test" } },
      { ...base, anchor: "tool-call", max_anchors: null, seed: 9, records: ["a/*.jsonl", "b/**/*.jsonl"] },
    ]) {
      const once = parseReplayConfig(raw);
      const dumped = dumpReplayConfig(once);
      expect(parseReplayConfig(dumped)).toEqual(once);
      expect(JSON.stringify(parseReplayConfig(dumped))).toBe(JSON.stringify(once));
    }
  });

  it("rejects anchor options with recheck, compared against defaults", () => {
    expect(refusal({ ...base, mode: "recheck", anchor: "tool-call" }).message).toMatch(/anchor/);
    expect(refusal({ ...base, mode: "recheck", max_anchors: 3 }).message).toMatch(/max_anchors/);
    expect(refusal({ ...base, mode: "recheck", max_anchors: null }).code).toBe("invalid_request");
    // Explicit defaults are what a dumped config carries: accepted.
    expect(parseReplayConfig({ ...base, mode: "recheck", anchor: "compaction", max_anchors: 1 }).mode).toBe("recheck");
  });

  it("rejects bad values and unknown keys", () => {
    expect(refusal({ ...base, max_anchors: 0 }).message).toMatch(/max_anchors/);
    expect(refusal({ ...base, records: [] }).message).toMatch(/records/);
    expect(refusal({ ...base, records: "" }).message).toMatch(/records/);
    expect(refusal({ ...base, source: {} }).message).toMatch(/source/);
    expect(refusal({ ...base, min_source_reward: 1, max_source_reward: 0 }).message).toMatch(/min_source_reward/);
    expect(refusal({ ...base, follow: true }).message).toMatch(/follow/);
    expect(refusal({ ...base, mode: "resume" }).code).toBe("invalid_request");
  });

  it("rejects a glob that cannot be expanded, up front instead of on the first load", async () => {
    expect(refusal({ ...base, records: "run/step_[z-a]/x.jsonl" })).toMatchObject({ code: "invalid_request", message: expect.stringMatching(/records: .*step_\[z-a\]/) });
    expect(refusal({ ...base, records: ["run/step_*/x.jsonl", "run/[b-a]*/x.jsonl"] }).message).toMatch(/records\.1: /);
    expect(parseReplayConfig({ ...base, records: ["run/step_[0-9]/x.jsonl", "run/[!.]*/**/x.jsonl", "run/[unclosed/x"] }).records).toHaveLength(3);
    // expandGlobs refuses it too (it is exported), before touching the file system.
    const error = await expandGlobs(["step_[z-a]/x"], "/nonexistent").then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect(error).toMatchObject({ code: "invalid_request" });
  });

  it("derives the index filters: only compaction needs two branches", () => {
    expect(recordFilters(parseReplayConfig(base))).toEqual({ minReward: null, maxReward: null, minBranches: 2 });
    expect(recordFilters(parseReplayConfig({ ...base, anchor: "tool-call", min_source_reward: 0 })).minBranches).toBe(1);
    expect(recordFilters(parseReplayConfig({ ...base, mode: "recheck", max_source_reward: 0.5 }))).toEqual({
      minReward: null,
      maxReward: 0.5,
      minBranches: 1,
    });
  });

  it("narrows the source table to the source environment's own config type", () => {
    const replay = new ReplayTaskSource({ ...base, source: { id: "gsm8k" } }, mathSource());
    expect(replay.sourceConfig).toEqual({ id: "gsm8k", split: "train" }); // source default applied
    expect(() => new ReplayTaskSource({ ...base, source: { id: "gsm8k", split: "dev" } }, mathSource())).toThrow(/split/);
    expect(() => new ReplayTaskSource({ ...base, source: { id: "gsm8k", extra: 1 } }, mathSource())).toThrow(ReplayError);
    expect(() => new ReplayTaskSource({ ...base, source: { id: "mbpp" } }, mathSource())).toThrow(/mbpp/);
  });
});

describe("poll_interval_ms", () => {
  it("refuses a poll interval no timer can wait (over 2^31 - 1 ms fires after 1 ms: a reload every millisecond)", () => {
    expect(parseReplayConfig({ ...base, poll_interval_ms: 2 ** 31 - 1 }).poll_interval_ms).toBe(2 ** 31 - 1);
    const error = refusal({ ...base, poll_interval_ms: 2 ** 31 });
    expect(error.code).toBe("invalid_request");
    expect(error.message).toMatch(/poll_interval_ms/);
  });
});
