import { z } from "zod";
import { isStorageFailure, storageFailureDetail } from "./storage-failure.js";

/**
 * The error catalog: every refusal anywhere in gym-ckpt carries one of these codes.
 * `docs/errors.md` mirrors this table; a unit test keeps the two in step.
 * `status` is the HTTP status the controller API answers with.
 */
export const ERROR_CATALOG = {
  unauthorized: {
    status: 401,
    meaning: "The bearer token is missing or wrong.",
    solve: "Send `Authorization: Bearer <token>` with the token configured for the deployment.",
  },
  invalid_request: {
    status: 400,
    meaning:
      "The message is not valid JSON, has unknown or mistyped fields, names a key twice in one object or holds an integer a double cannot hold exactly (JSON.parse would keep the last key or round the number: a controller request and a participant's control message alike), or breaks a documented limit.",
    solve: "Fix the request; the detail names the offending field.",
  },
  payload_too_large: {
    status: 413,
    meaning: "The message, body or record is larger than its limit (a control message: 1 MiB); the detail names the limit.",
    solve: "Keep control messages small: records travel through checkpoint storage, never on the bus. For a record or body, the detail says what to leave out.",
  },
  unsupported_content_coding: {
    status: 415,
    meaning:
      "The attach proxy cannot decode the content coding of a generation request's body (its `Content-Encoding`, or a `Transfer-Encoding` coding other than `chunked`), so it cannot read the call it must track; the answer's `Accept-Encoding` lists the codings it decodes. Nothing was sent upstream.",
    solve: "Send the body uncompressed or in one of the codings the answer's `Accept-Encoding` lists (gzip, deflate, br).",
  },
  reply_too_large: {
    status: 502,
    meaning: "The operation succeeded, but its reply is larger than the control-message limit (1 MiB, or the NATS server's lower `max_payload`), even with its long lists left out, so it cannot travel over NATS.",
    solve: "Read the result another way (`get`, `status`, `list`, or the HTTP API, which has no such limit); retrying the op with the same arguments answers the same way.",
  },
  stale_checkpoint: {
    status: 409,
    meaning: "The checkpoint id was already resumed (or aborted before its prepare arrived).",
    solve: "Start a new checkpoint with a fresh id; a delayed call from an old controller is fenced on purpose.",
  },
  stale_epoch: {
    status: 409,
    meaning: "The coordinator epoch is lower than one this participant has already seen.",
    solve: "Another coordinator took over; this one must stop sending phase messages.",
  },
  stale_incarnation: {
    status: 409,
    meaning: "The message is addressed to another process incarnation of this participant (it restarted after the checkpoint opened).",
    solve: "Nothing to do for that checkpoint: the new process never took part in it. Start a new checkpoint.",
  },
  checkpoint_conflict: {
    status: 409,
    meaning:
      "A different checkpoint is active, or a retried commit names another directory or scope; or the checkpoint's path under the root is taken by something not a directory (the coordinator's prepare or commit: nothing was committed). `gym-ckpt collect` answers it too, before anything is changed, when another collector holds the checkpoint root, or when the root's `dispatched.jsonl` is another collection's (other `--tasks`, `--out` or `--rollout-id-prefix`).",
    solve:
      "Resume (abort) the active checkpoint first, or retry with the same arguments; move what holds the path, or use another checkpoint id. For collect: wait for the other collector; run the earlier collection's command again to continue it, or pass `--new-collection` to abandon it (docs/collect.md, \"Another collection in the same root\").",
  },
  invalid_phase: {
    status: 409,
    meaning: "The operation is not allowed in the participant's current phase (or readiness regressed before commit), or in the phase of the checkpoint the coordinator has open.",
    solve: "Follow the phase machine: prepare, commit, resume; retire and forget only while no checkpoint is open or during a restore (before its resume).",
  },
  deadline_exceeded: {
    status: 409,
    meaning:
      "The absolute deadline passed before or during the operation. A participant whose clock runs ahead of the coordinator's refuses ops so as soon as they arrive: its detail then names the skew (`this participant's clock reads 120.0 s ahead of the coordinator's`).",
    solve: "Retry with a later deadline; idempotent retries return the same result. When the detail names a clock skew, sync the hosts' clocks (NTP; docs/operations.md, Clocks).",
  },
  stale_attempt: {
    status: 409,
    meaning: "A data-plane request from a retired attempt or from an attempt a restore continued as a later one, or a session bound to another attempt; a restore into a retired attempt.",
    solve: "Dispatch the rollout as a newer attempt; the old one is fenced until forget.",
  },
  admission_closed: {
    status: 409,
    meaning: "A checkpoint is open and this server does not admit new work until resume, or the request names a session a resources or agent server is still freeing, or the attach proxy is shutting down.",
    solve: "Retry after the checkpoint resumes (or the free ended, or against the restarted proxy).",
  },
  rollout_id_required: {
    status: 400,
    meaning: "Work arrived without a rollout id, so a checkpoint could neither record nor retire it.",
    solve: "Send episode-scoped calls under the `/ng-rollout/<capture_key>/` path prefix.",
  },
  restart_in_scope: {
    status: 409,
    meaning: "The commit scope names an episode this participant reported as a restart.",
    solve: "Leave the participant's `restarts` out of the commit scope; restart those rollouts from input.",
  },
  invalid_checkpoint_state: {
    status: 422,
    meaning: "Checkpoint files are missing, corrupt, or belong to another checkpoint, kind or instance (to `gym-ckpt verify --strict`, also: files no manifest names are there); or restore found live state.",
    solve: "Restore from another published checkpoint (see `gym-ckpt verify`), into fresh processes.",
  },
  not_found: {
    status: 404,
    meaning: "The named checkpoint or resource does not exist, or the membership registry lists no participant to send the op to.",
    solve: "List published checkpoints with `gym-ckpt ls`; `gym-ckpt status` lists the registered participants.",
  },
  instance_conflict: {
    status: 409,
    meaning:
      "Another live process already serves this participant kind/instance (it answers on the participant's subjects, or claimed its membership entry first), or took it over while this one was cut off from NATS (logged when this one is back; it stops answering the name and the reference programs exit 1).",
    solve: "Run one process per kind/instance: stop the other process, or give this one its own instance name. A restart whose predecessor is gone (nobody answers on its subjects) takes over by itself.",
  },
  unreachable: {
    status: 503,
    meaning: "Nobody answers on the participant's subject (NATS no-responders); or the coordinator cannot read the participant's membership entry (another protocol version's announcement, a corrupt value: the detail names its key and why; never sent anything); or a participant program could not reach any NATS server when it started, within `--nats-connect-wait-ms` (default 10 s; it exits 1).",
    solve: "Check the participant process; an unreachable participant resumes by itself when its lease expires. An unreadable membership entry: run coordinators and participants of one protocol version (its next heartbeat replaces a corrupt value; `nats kv del` removes a stray one). At start-up: check that NATS runs at the configured address (--nats, GYM_CKPT_NATS_URL); a supervisor's restart then succeeds.",
  },
  upstream_failed: {
    status: 502,
    meaning: "The attach proxy's upstream (the inference server behind it) could not be reached, refused its TLS, failed or closed before its answer was complete, or answered with a `Connection` header naming `Content-Encoding` or `Content-Type` (the detail names it); no capture-ledger row was written for the call. Also a reference Gym server's data-plane call whose connection failed (its detail names the path called), and a reference agent's policy call whose stream ended in an error event. Also a reference Gym server's `/run` (and the agent's `activate`) when a callee refused one of the episode's calls, so its caller never takes the callee's code for the route's own (a resources server's `stale_attempt` for a fenced attempt, its `invalid_request` for a bad task); the detail names the call and the callee's code (`a call this route depends on failed: seed_session refused with stale_attempt: …`). A callee's `storage_error` and `upstream_failed` are answered as they are.",
    solve: "Check the inference server the proxy's `--upstream` names (or the Gym server the path belongs to); the call was not recorded, so send it again (the reference agent sends a policy call again twice by itself). A `/run` that failed so ran part way: dispatch the rollout as a new attempt (`gym-ckpt collect` retires it and sends the next one); the callee's code in the detail says what to fix there.",
  },
  outcome_unknown: {
    status: 504,
    meaning: "A request timed out, a journal write before anything was sent failed (a commit decision or its withdrawal by a resume, a restore, the resume of a restored checkpoint or the clean-up it runs: nothing more was sent, but the write may have landed), or the coordinator lost leadership after the op began, or (a `resume` of an id this coordinator did not close in its current leadership term, or a `restore` other than of a published checkpoint nobody resumed, whose own entry holds that record's key) the decision journal could not be read to learn how a restore of that id last settled (nothing sent); the participant (or a successor completing a journaled decision) may or may not have acted.",
    solve: "Retry with the same checkpoint id: every operation is idempotent per (checkpoint_id, op).",
  },
  journal_unavailable: {
    status: 503,
    meaning:
      "The coordinator could not write its decision journal in JetStream KV (unavailable, a timeout, a full or misconfigured journal bucket, missing permissions) when a checkpoint opened; nothing was committed and every participant was resumed (one the resume did not reach resumes when its lease expires). The same id retried is answered the same.",
    solve:
      "Check JetStream: the server runs with JetStream, its storage, cluster quorum, the coordinator's permissions on the journal bucket; then retry the checkpoint with a new id.",
  },
  not_leader: {
    status: 503,
    meaning: "This coordinator does not hold the leader lease (or is still waiting out its first lease period, or recovering its predecessor's checkpoints, or stopping), or a client reached no coordinator at all (NATS or the HTTP API refused the connection). Nothing was sent or journaled (also when leadership was lost while an op ran but before it sent or journaled anything); an op that loses leadership after it sent or journaled something answers `outcome_unknown` instead.",
    solve: "Send controller calls to the active coordinator (check that NATS and a coordinator run), or retry shortly.",
  },
  prepare_incomplete: {
    status: 409,
    meaning: "Prepare did not finish before its deadline; the detail names each participant not prepared with its code or blocker count and up to 10 of its blockers (the detail is cut at 4096 characters).",
    solve: "Resume to abort, retire the blockers (`prepare` and `status` list up to 100 per participant, with the count), then prepare again.",
  },
  restore_failed: {
    status: 409,
    meaning: "A participant failed to restore (or, answering a `resume`, restarted since it restored; not when every participant refused it with a code that promises nothing was installed, `RESTORE_REFUSALS`, none parked in another checkpoint: that refusal is answered, nothing cleaned up); the replacement attempts were retired wherever the restore may have installed them (a retire that failed, no responders included, is sent again until the clean-up's deadline; where it still failed, the detail names that participant first) and everyone resumed (a resume that did not get through is sent again until that deadline too, and named last where it still did not); neither is sent again to a participant the membership registry no longer lists, named `not in the membership registry any more`.",
    solve: "Restart the listed rollouts from their input as a later attempt; where the detail says attempt+1 could not be retired, `retire` it again first to free what that participant restored.",
  },
  invalid_coordinates: {
    status: 422,
    meaning: "A cohort verifier got invalid coordinates (_ng_group_id, _ng_group_attempt, _ng_rollout_index).",
    solve: "Send a group id, a group attempt ≥ 0 and a member slot in 0..N-1.",
  },
  cohort_slot_conflict: {
    status: 409,
    meaning: "The cohort member slot already holds a different payload (even after the cohort finished).",
    solve: "Replay only the identical payload; send a changed answer as a new group attempt.",
  },
  cohort_task_conflict: {
    status: 409,
    meaning: "A cohort member's task differs from the task of the members already in its cohort (a cohort's responses are judged against one task).",
    solve: "Send every member of a group the same task; a group that mixed tasks is retried from input as a new group attempt.",
  },
  cohort_superseded: {
    status: 409,
    meaning: "A newer _ng_group_attempt of the cohort exists; this attempt is retired.",
    solve: "Verify under the newest group attempt.",
  },
  cohort_failed: {
    status: 503,
    meaning: "The cohort did not collect every member before its collection timeout (an evaluation that times out is answered 200 with masked `judge_failed` results instead).",
    solve: "Retry the whole group from input as a new group attempt.",
  },
  cohort_capacity: {
    status: 503,
    meaning: "The cohort verifier already has its maximum number of cohorts collecting or being judged, so no new cohort can start.",
    solve: "Retry later, once running cohorts finish (members of cohorts already started are still admitted), or raise the verifier's maxActiveCohorts (--max-active-cohorts).",
  },
  sandbox_capacity: {
    status: 503,
    meaning: "A sandboxed verifier (code, competitive programming) already has its maximum number of runs waiting for a sandbox slot, so it takes no more.",
    solve: "Retry later, once queued runs started, or run more verifier processes (or raise --max-sandbox-queue, within the process's file-descriptor limit: each waiting /verify holds a connection).",
  },
  // 507, not 503: clients retry a 503 shortly (not_leader); a full disk waits for its operator.
  storage_error: {
    status: 507,
    meaning:
      "A file operation failed in the deployment's storage, not in gym-ckpt: a full disk, quota or file size limit (ENOSPC, EDQUOT, EFBIG), an I/O error or a stale network file handle (EIO, ESTALE), a read-only mount (EROFS), no permission (EACCES, EPERM), a directory that cannot exist there (ENOENT, ENOTDIR: say, a checkpoint root not mounted on that host; ENAMETOOLONG), a directory on a case-insensitive filesystem where files or directories are named by ids that differ in case (the model's capture ledger, the checkpoint root), or no file descriptors left (EMFILE, ENFILE). The detail names the system error, the call and the path.",
    solve:
      "Fix the storage on the host that answered (free space or quota, remount read-write, ownership, mount the checkpoint root, raise the open-file limit, move a ledger directory or the checkpoint root to a case-sensitive filesystem), then retry. A checkpoint that failed so published nothing: the `checkpoint` op resumed everyone and removed what its participants had committed (take it again with a fresh id); after a failed `commit`, `resume` it first (or retry the commit once there is room).",
  },
  internal_error: {
    status: 500,
    meaning: "An unexpected failure inside gym-ckpt.",
    solve: "Check the logs (they carry the trace id) and report a bug.",
  },
} as const satisfies Record<string, { status: number; meaning: string; solve: string }>;

export type ErrorCode = keyof typeof ERROR_CATALOG;
export const ERROR_CODES = Object.keys(ERROR_CATALOG) as ErrorCode[];
export const ErrorCodeSchema = z.enum(ERROR_CODES as [ErrorCode, ...ErrorCode[]]);

/**
 * Restore refusals a participant gives before installing anything (a refusal changes no state): the
 * coordinator's all-or-nothing clean-up does not retire attempt+1 where one of these was answered.
 * Any other failure (a timeout, an install that outlived its deadline, an internal error) may have
 * installed it. A participant whose failed install left state held therefore never answers one of
 * these codes for it.
 */
export const RESTORE_REFUSALS: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  "unauthorized",
  "invalid_request",
  "payload_too_large",
  "stale_checkpoint",
  "stale_epoch",
  "stale_incarnation",
  "checkpoint_conflict",
  "invalid_phase",
  "invalid_checkpoint_state",
  "stale_attempt",
  "not_found",
  "unreachable",
]);

/** The body of every refusal, on NATS and HTTP alike. */
export const ErrorReplySchema = z
  .object({
    error: z.object({ code: ErrorCodeSchema, detail: z.string() }).strict(),
  })
  .strict();
export type ErrorReply = z.infer<typeof ErrorReplySchema>;

/** A refusal in the catalog's shape whose code may be one this build lacks (the catalog only grows). */
const ForeignRefusalSchema = z
  .object({ error: z.object({ code: z.string().regex(/^[a-z][a-z0-9_]{0,63}$/), detail: z.string() }).strict() })
  .strict();

/**
 * A refusal of `op` whose code this build's catalog does not know (a newer peer's), as
 * `internal_error` naming `who`, that code and its detail; undefined for anything else. Without it the refusal
 * fails the reply's schema and reads as "invalid reply", its code and detail lost.
 */
export function foreignRefusal(value: unknown, who: string, op: string): CheckpointError | undefined {
  const parsed = ForeignRefusalSchema.safeParse(value);
  if (!parsed.success || (ERROR_CODES as string[]).includes(parsed.data.error.code)) return undefined;
  const { code, detail } = parsed.data.error;
  return new CheckpointError("internal_error", `${who} refused the ${op} with code ${code}, which this build's error catalog does not know (a newer version's?): ${detail}`);
}

/** Longest refusal detail put on the wire (characters). */
export const MAX_ERROR_DETAIL = 4096;

const MARK = Symbol.for("gym-ckpt.CheckpointError");

/**
 * The one error class of the project: a code from the catalog, a human detail, an optional cause.
 * `instanceof` works across duplicate copies of the package (the symbol is global).
 */
export class CheckpointError extends Error {
  readonly code: ErrorCode;
  readonly data: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, detail: string, options: { cause?: unknown; data?: Record<string, unknown> } = {}) {
    super(detail, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "CheckpointError";
    this.code = code;
    this.data = options.data;
  }

  static override [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === "object" && value !== null && (value as Record<symbol, unknown>)[MARK] === true;
  }

  get status(): number {
    return ERROR_CATALOG[this.code].status;
  }

  /** The wire form; a long detail (it may quote the request) is cut so a refusal always fits a message. */
  toReply(): ErrorReply {
    const detail = this.message.length > MAX_ERROR_DETAIL ? `${this.message.slice(0, MAX_ERROR_DETAIL)}… (${this.message.length} characters)` : this.message;
    return { error: { code: this.code, detail } };
  }

  static fromReply(reply: ErrorReply): CheckpointError {
    return new CheckpointError(reply.error.code, reply.error.detail);
  }
}
Object.defineProperty(CheckpointError.prototype, MARK, { value: true });

/**
 * Turns anything thrown into a catalog error: a file-system call the storage refused becomes
 * `storage_error` (the operator's disk or mount, not a bug); other unknown failures `internal_error`.
 */
export function toCheckpointError(error: unknown): CheckpointError {
  if (error instanceof CheckpointError) return error;
  if (isStorageFailure(error)) return new CheckpointError("storage_error", storageFailureDetail(error as Error), { cause: error });
  const detail = error instanceof Error ? error.message : String(error);
  return new CheckpointError("internal_error", detail, { cause: error });
}

/**
 * Readable one-line description of a zod failure, for `invalid_request` details. `subject` names
 * what was parsed when it is a bare value (a checkpoint id on a command line), not an object's field.
 */
export function describeZodError(error: z.ZodError, subject = "(root)"): string {
  return error.issues
    .slice(0, 5)
    .map((issue) => `${issue.path.length ? issue.path.join(".") : subject}: ${issue.message}`)
    .join("; ");
}
