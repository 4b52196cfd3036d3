import { z } from "zod";
import { keepingProtoKey, MAX_TIMER_MS } from "../../protocol/index.js";
import { describeIssues, invalidRequest } from "./errors.js";
import { globProblem } from "./record-glob.js";
import type { RecordFilters } from "./record-reader.js";

export const DEFAULT_RECHECK_PROMPT =
  "Carefully check your work above. Re-verify the reasoning and the final answer against the task; " +
  "if you find any mistakes, fix them. Then state your final answer.";

/** A replay config file larger than this is refused unread: a config is a few lines of JSON. */
export const MAX_REPLAY_CONFIG_BYTES = 1 << 20;

const DEFAULT_ANCHOR = "compaction";
const DEFAULT_MAX_ANCHORS = 1;

/**
 * Replay task source config. `source` is the original environment's own config: only its `id`
 * is checked here; the source environment narrows the rest with its own strict schema.
 * Rules compare against defaults rather than "was the field set", so a dumped, fully resolved
 * config re-validates identically in every worker.
 */
export const ReplayConfigSchema = z
  .object({
    /** A glob or list of globs (`**` allowed), re-expanded on every reload. */
    records: z.union([z.string().min(1), z.array(z.string().min(1)).min(1)]),
    /** The source environment's own config: a key named `__proto__` is data too (zod would drop it). */
    source: keepingProtoKey(z.object({ id: z.string().min(1) }).catchall(z.unknown())),
    mode: z.enum(["continue", "recheck"]).default("continue"),
    anchor: z.enum(["compaction", "tool-call"]).default(DEFAULT_ANCHOR),
    /** tool-call only: seeded draw of this many anchors per record; null keeps all. */
    max_anchors: z.number().int().min(1).nullable().default(DEFAULT_MAX_ANCHORS),
    recheck_prompt: z.string().min(1).default(DEFAULT_RECHECK_PROMPT),
    max_seed_tokens: z.number().int().min(1).nullable().default(null),
    min_source_reward: z.number().nullable().default(null),
    max_source_reward: z.number().nullable().default(null),
    /** Salt for the tool-call anchor draw. */
    seed: z.number().int().default(0),
    /** Follow mode: consume a step's files only once its step-complete marker lists them. */
    wait_for_step_marker: z.boolean().default(false),
    /**
     * Follow mode: how often the async iterator reloads when it runs dry; null = never (call reload()).
     * At most what a timer waits: a longer delay fires after 1 ms, reloading every millisecond.
     */
    poll_interval_ms: z.number().int().min(1).max(MAX_TIMER_MS).nullable().default(null),
    /** Hash the whole record file against the index header before trusting it (reads every byte). */
    verify_index_sha256: z.boolean().default(false),
  })
  .strict()
  .superRefine((c, ctx) => {
    (typeof c.records === "string" ? [c.records] : c.records).forEach((pattern, i) => {
      const problem = globProblem(pattern);
      if (problem !== null) ctx.addIssue({ code: "custom", path: typeof c.records === "string" ? ["records"] : ["records", i], message: problem });
    });
    if (c.mode === "recheck" && c.anchor !== DEFAULT_ANCHOR) {
      ctx.addIssue({ code: "custom", path: ["anchor"], message: "anchor applies to mode=continue only" });
    }
    if (c.mode === "recheck" && c.max_anchors !== DEFAULT_MAX_ANCHORS) {
      ctx.addIssue({ code: "custom", path: ["max_anchors"], message: "max_anchors applies to mode=continue only" });
    }
    if (c.min_source_reward !== null && c.max_source_reward !== null && c.min_source_reward > c.max_source_reward) {
      ctx.addIssue({ code: "custom", path: ["min_source_reward"], message: "min_source_reward exceeds max_source_reward" });
    }
  });

export type ReplayConfigInput = z.input<typeof ReplayConfigSchema>;
export type ReplayConfig = z.infer<typeof ReplayConfigSchema>;

export function parseReplayConfig(raw: unknown): ReplayConfig {
  const parsed = ReplayConfigSchema.safeParse(raw);
  if (!parsed.success) throw invalidRequest(`invalid replay config: ${describeIssues(parsed.error.issues)}`);
  return parsed.data;
}

/** The resolved config as plain JSON (every default filled in); parseReplayConfig accepts it unchanged. */
export function dumpReplayConfig(config: ReplayConfig): ReplayConfigInput {
  return JSON.parse(JSON.stringify(config)) as ReplayConfigInput;
}

export function recordPatterns(config: ReplayConfig): string[] {
  return typeof config.records === "string" ? [config.records] : [...config.records];
}

/** Index/parse filters implied by the config. Only a compaction restart needs a second branch. */
export function recordFilters(config: ReplayConfig): RecordFilters {
  return {
    minReward: config.min_source_reward,
    maxReward: config.max_source_reward,
    minBranches: config.mode === "continue" && config.anchor === "compaction" ? 2 : 1,
  };
}
