import { isAbsolute } from "node:path";
import { z } from "zod";
import { BearerTokenSchema, DEFAULT_NATS_CONNECT_TIMEOUT_MS, DEFAULT_NATS_CONNECT_WAIT_MS, DEFAULT_NATS_URL, DeploymentSchema, InstanceSchema, KindSchema, MAX_DEADLINE_AHEAD_S, MAX_NATS_CONNECT_TIMEOUT_MS, MAX_NATS_CONNECT_WAIT_MS, MIN_LEASE_MS, type Kind } from "../../protocol/index.js";
import { LOG_LEVELS } from "../telemetry/logger.js";

/** The longest `stop_grace_ms`: the HTTP client waits at most this long (and a minute) on a coordinator that closed its listener to stop. */
export const MAX_STOP_GRACE_MS = 600_000;

/** One expected participant, written `kind/instance` (e.g. `resources/r1`). */
export const ExpectedParticipantSchema = z.string().superRefine((value, ctx) => {
  const [kind, instance, ...rest] = value.split("/");
  if (rest.length > 0 || !KindSchema.safeParse(kind).success || !InstanceSchema.safeParse(instance).success) {
    ctx.addIssue({ code: "custom", message: `expected participant "${value}" must be kind/instance, kind one of environment, model, agent, resources` });
  }
});

/** The `kind/instance` strings of `expected_participants` as refs (already validated by the schema). */
export function expectedRefs(expected: readonly string[] | undefined): { kind: Kind; instance: string }[] {
  return (expected ?? []).map((value) => {
    const [kind, instance] = value.split("/");
    return { kind: kind as Kind, instance: instance! };
  });
}

/**
 * The most published checkpoints `retention` may keep. `list` over NATS answers every published
 * checkpoint in one message (it leaves none out; docs/api.md, "Reply size"), which a larger
 * retention would pass (about 4,700 entries with 128-character ids: every list `reply_too_large`).
 * An entry's JSON is at most about 262 bytes (a 128-character id; published_at at its longest,
 * 25 characters; epoch and participants 17 each), so the 2,001 a listing shows at this cap (LATEST
 * is never deleted: one more) take about 525 KB of the 1 MiB a reply may hold, with LATEST's error
 * about 550 KB: room for some 1,900 more, checkpoints that retention could not rename away
 * (test/unit/coordinator/list-reply-at-retention-cap.test.ts).
 */
export const MAX_RETENTION = 2_000;

/** Effective configuration of `gym-ckpt coordinator`: defaults < file < env GYM_CKPT_* < flags. */
export const CoordinatorConfigSchema = z
  .object({
    deployment: DeploymentSchema.default("default"),
    nats: z
      .object({
        servers: z.string().min(1).default(DEFAULT_NATS_URL),
        user: z.string().optional(),
        pass: z.string().optional(),
        token: z.string().optional(),
        /** How long the start waits for a NATS server that does not accept connections yet (0: try once; then exit 1). */
        connect_wait_ms: z.number().int().min(0).max(MAX_NATS_CONNECT_WAIT_MS).default(DEFAULT_NATS_CONNECT_WAIT_MS),
        /** How long one connect waits for a server that accepted the TCP connection to speak NATS (nats.js's `timeout`). */
        connect_timeout_ms: z.number().int().min(1).max(MAX_NATS_CONNECT_TIMEOUT_MS).default(DEFAULT_NATS_CONNECT_TIMEOUT_MS),
      })
      .strict()
      .default({ servers: DEFAULT_NATS_URL, connect_wait_ms: DEFAULT_NATS_CONNECT_WAIT_MS, connect_timeout_ms: DEFAULT_NATS_CONNECT_TIMEOUT_MS }),
    /** Bearer token of the participants' control subjects (required). */
    token: BearerTokenSchema,
    /** Bearer token of the controller API (NATS and HTTP); defaults to `token`. */
    controller_token: BearerTokenSchema.optional(),
    checkpoint_root: z.string().refine((p) => isAbsolute(p), "checkpoint_root must be an absolute path"),
    /**
     * Refuse to start (storage_error) while the root holds no deployment claim yet, rather than
     * make the root and claim it: a root on storage not mounted yet (its mount point an empty
     * directory on the local disk) would otherwise become the deployment's, its checkpoints hidden
     * once the storage is mounted over them. Set it once the first start claimed the root.
     */
    require_existing_root_claim: z.boolean().default(false),
    /** Published checkpoints to keep. */
    retention: z
      .number()
      .int()
      .min(1)
      .max(MAX_RETENTION, `retention may be at most ${MAX_RETENTION}: a list of more checkpoints would not fit one NATS reply (1 MiB)`)
      .default(2),
    /** Leader lease period (the leader bucket's max_age). */
    lease_ms: z.number().int().min(MIN_LEASE_MS).max(600_000).default(5_000),
    /** The deadline of an op without one; participants refuse deadlines further than 7 days ahead. */
    default_timeout_ms: z.number().int().min(100).max(MAX_DEADLINE_AHEAD_S * 1000).default(60_000),
    /**
     * How long a try waits past the deadline for its reply (transit, a participant answering right at
     * it). Small: after a failed prepare (this much past the deadline) the abort's resume runs, and the
     * reply must still reach a controller that waits deadline + 10 s (the clients' default slack).
     * At most 10 minutes: the wait for an op's turn is a timer of deadline (up to 7 days) + this.
     * (systemClock splits a timer past setTimeout's 2^31 - 1 ms, which Node would fire at once.)
     */
    request_slack_ms: z.number().int().min(0).max(600_000).default(2_000),
    /**
     * One try of a participant request waits at most this long before it is sent again (same body,
     * idempotent): core NATS delivers at most once, so a lost message must not cost the whole deadline.
     * At most 10 minutes, as the other timings: a try longer than that is no retry of a lost message,
     * and the bound keeps the try's timer far below setTimeout's 2^31 - 1 ms, whatever caps it later.
     */
    request_attempt_ms: z.number().int().min(100).max(600_000).default(10_000),
    /**
     * While a try of a guarded op (addressed to one process) waits longer than this, the
     * participant's status subject is probed this often; a try whose process is gone from NATS (no
     * responders, 4 probes in a row) ends then, not at its timeout. 0: no probes.
     */
    request_probe_ms: z
      .number()
      .int()
      .max(600_000)
      .refine((ms) => ms === 0 || ms >= 100, "must be 0 (no probes) or at least 100")
      .default(1_000),
    /**
     * On SIGTERM, how long the ops under way may still run to be answered. Past it the daemon stops
     * as after a crash (the ops unanswered, a successor completes or aborts them): a prepare held by
     * a blocker runs to its deadline (60 s by default), past the supervisors' 30 s before SIGKILL,
     * which would leave the lease held and telemetry unflushed.
     */
    stop_grace_ms: z.number().int().min(0).max(MAX_STOP_GRACE_MS).default(15_000),
    http: z
      .object({
        enabled: z.boolean().default(true),
        host: z.string().min(1).default("127.0.0.1"),
        port: z.number().int().min(0).max(65_535).default(8480),
      })
      .strict()
      .default({ enabled: true, host: "127.0.0.1", port: 8480 }),
    coordinator_id: z.string().min(1).max(128).optional(),
    /**
     * Participants every checkpoint must include (reference §3.1: discovery is config-driven). One
     * missing from the membership registry (no heartbeat within its TTL) is an `unreachable` blocker,
     * so the checkpoint is not published without it. Unset: the registry alone decides.
     */
    expected_participants: z
      .array(ExpectedParticipantSchema)
      .max(10_000)
      .refine((list) => new Set(list).size === list.length, "expected_participants lists a participant twice")
      .optional(),
    log_level: z.enum(LOG_LEVELS).default("info"),
  })
  .strict();
export type CoordinatorConfig = z.infer<typeof CoordinatorConfigSchema>;
export type CoordinatorConfigInput = z.input<typeof CoordinatorConfigSchema>;

/** Paths whose values never appear in printed config or logs. */
export const SECRET_CONFIG_PATHS = ["token", "controller_token", "nats.pass", "nats.token"] as const;
