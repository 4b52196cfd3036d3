import { isAbsolute } from "node:path";
import { z } from "zod";
import { BearerTokenSchema, DEFAULT_NATS_URL, DeploymentSchema } from "../../protocol/index.js";
import { LOG_LEVELS } from "../telemetry/logger.js";

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
      })
      .strict()
      .default({ servers: DEFAULT_NATS_URL }),
    /** Bearer token of the participants' control subjects (required). */
    token: BearerTokenSchema,
    /** Bearer token of the controller API (NATS and HTTP); defaults to `token`. */
    controller_token: BearerTokenSchema.optional(),
    checkpoint_root: z.string().refine((p) => isAbsolute(p), "checkpoint_root must be an absolute path"),
    /** Published checkpoints to keep. */
    retention: z.number().int().min(1).default(2),
    /** Leader lease period (the leader bucket's max_age). */
    lease_ms: z.number().int().min(200).max(600_000).default(5_000),
    default_timeout_ms: z.number().int().min(100).default(60_000),
    request_slack_ms: z.number().int().min(0).default(5_000),
    /**
     * One try of a participant request waits at most this long before it is sent again (same body,
     * idempotent): core NATS delivers at most once, so a lost message must not cost the whole deadline.
     */
    request_attempt_ms: z.number().int().min(100).default(10_000),
    http: z
      .object({
        enabled: z.boolean().default(true),
        host: z.string().min(1).default("127.0.0.1"),
        port: z.number().int().min(0).max(65_535).default(8480),
      })
      .strict()
      .default({ enabled: true, host: "127.0.0.1", port: 8480 }),
    coordinator_id: z.string().min(1).max(128).optional(),
    log_level: z.enum(LOG_LEVELS).default("info"),
  })
  .strict();
export type CoordinatorConfig = z.infer<typeof CoordinatorConfigSchema>;
export type CoordinatorConfigInput = z.input<typeof CoordinatorConfigSchema>;

/** Paths whose values never appear in printed config or logs. */
export const SECRET_CONFIG_PATHS = ["token", "controller_token", "nats.pass", "nats.token"] as const;
