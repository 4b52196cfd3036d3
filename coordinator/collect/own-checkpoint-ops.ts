import type { Logger } from "pino";
import { CheckpointError, type CtlReplyOf, type CtlRequestInputOf, type EpisodeId } from "../../protocol/index.js";
import type { AsyncLock } from "../engine/async-lock.js";
import { participantFailurePrefix } from "../engine/participant-client.js";
import { COLLECTION_STATE_FILE } from "./collection-state.js";
import { delay } from "./delay.js";
import type { RetryPauses } from "./retry-pauses.js";

/** Tries of a controller op whose outcome is unknown before it counts as failed (see resent). */
const RESEND_TRIES = 3;
/**
 * Codes after which an op is sent again with the same arguments: it did nothing (`not_leader`;
 * `deadline_exceeded` of a deadline that passed while it waited) or its outcome is unknown (a
 * failover mid-op: the successor re-drives it, and the retry gets the original reply).
 */
export const RESENT_CODES: ReadonlySet<string> = new Set(["deadline_exceeded", "outcome_unknown", "not_leader"]);

/** The controller ops sent here; the collector's controller fits. */
export interface OwnCheckpointController {
  commit(request: CtlRequestInputOf<"commit">): Promise<CtlReplyOf<"commit">>;
  publish(request: CtlRequestInputOf<"publish">): Promise<CtlReplyOf<"publish">>;
  resume(request: CtlRequestInputOf<"resume">): Promise<CtlReplyOf<"resume">>;
  status(): Promise<CtlReplyOf<"status">>;
  get(checkpointId: string): Promise<CtlReplyOf<"get">>;
}

export interface OwnCheckpointOpsOptions {
  controller: OwnCheckpointController;
  logger: Logger;
  /** The collector's lock: a background round of resends runs under it, like every other op. */
  lock: AsyncLock;
  /** The deadline_ts of an op sent now. */
  deadline: () => number;
  /** The collection is stopping: no background round of resends is started any more. */
  stopping: () => boolean;
  pauses: RetryPauses;
}

/**
 * The collector's controller ops for its own checkpoints, sent again while their outcome is
 * unknown, and the resumes still unanswered after every try, sent again later.
 */
export class OwnCheckpointOps {
  /**
   * Our checkpoints whose resume never got an answer (no leader through every try): a successor
   * keeps a published checkpoint open for exactly this resume, so it is sent again every
   * `pauses.unresumedS` and before the next prepare (which that open checkpoint would refuse) rather
   * than leaving the Gym parked until the participants' lease expires: no next checkpoint may come.
   */
  private readonly unresumed = new Set<string>();
  private unresumedRetry: NodeJS.Timeout | undefined;
  /** run() returned or threw: nothing is sent in the background any more. */
  private ended = false;

  constructor(private readonly options: OwnCheckpointOpsOptions) {}

  /** run() returned or threw: no further round of resends. */
  end(): void {
    this.ended = true;
    clearTimeout(this.unresumedRetry);
  }

  /** Cancels the round of resends already due (halt: the collection is stopping). */
  clearRetryTimer(): void {
    clearTimeout(this.unresumedRetry);
  }

  /** A resume of `checkpointId` may be lost: sent again every `pauses.unresumedS` and before the next prepare. */
  rememberUnresumed(checkpointId: string): void {
    this.unresumed.add(checkpointId);
    this.retryUnresumedLater();
  }

  /**
   * Resumes one of our checkpoints, sent again while its outcome is unknown (like the restore's
   * resume): one that never reached a leader (it died between publish and resume) would be lost,
   * since a successor keeps a published checkpoint open for this resume. Still unknown after every
   * try, it is remembered in `unresumed`; any other refusal is logged and forgotten.
   */
  async resumeOwn(checkpointId: string, log: Logger, tries = RESEND_TRIES, published?: boolean): Promise<void> {
    try {
      await this.resumeSent("resume", checkpointId, tries);
      this.unresumed.delete(checkpointId);
    } catch (err) {
      const unknown = err instanceof CheckpointError && RESENT_CODES.has(err.code);
      if (unknown) this.unresumed.add(checkpointId);
      else this.unresumed.delete(checkpointId);
      if (failedAtSomeParticipants(err)) {
        // The coordinator closed the checkpoint and resumed everyone else; those it names resume
        // when their lease expires. Nothing for an operator to do (a published checkpoint stays published).
        log.warn({ err, ...(published !== undefined && { published }) }, "resume failed at some participants; they resume when their lease expires");
      } else {
        log.error({ err, sent_again_later: unknown }, "resume failed");
      }
      this.retryUnresumedLater();
    }
  }

  /** Sends every resume still unanswered again (under the lock); `tries` each. */
  async resumeUnresumed(tries = RESEND_TRIES): Promise<void> {
    for (const id of [...this.unresumed]) await this.resumeOwn(id, this.options.logger.child({ checkpoint_id: id }), tries);
  }

  /** While a resume is unanswered, another round of resends is due in `pauses.unresumedS` (not once stopping or ended). */
  private retryUnresumedLater(): void {
    if (this.unresumedRetry || this.unresumed.size === 0 || this.options.stopping() || this.ended) return;
    this.unresumedRetry = setTimeout(() => {
      this.unresumedRetry = undefined;
      if (this.options.stopping() || this.ended) return;
      // One try each: a round that waits out an outage holds the lock a stop checkpoint may need.
      void this.options.lock
        .run(() => this.resumeUnresumed(1))
        .finally(() => this.retryUnresumedLater());
    }, this.options.pauses.unresumedS * 1000);
    this.unresumedRetry.unref();
  }

  /**
   * A resume, sent again while its outcome is unknown (see resent). `not_found` (no coordinator has
   * it open, no participant holds it) leaves nothing to resume: typically the answer to a retry whose
   * first try did resume it, its reply lost with a coordinator that died after closing it and
   * removing its journal entry. Should a restore's clean-up have closed it instead, the attempt+1
   * it fenced is refused `stale_attempt` when sent, and the row's next attempt goes.
   */
  async resumeSent(what: string, checkpointId: string, tries = RESEND_TRIES): Promise<void> {
    try {
      await this.resent(what, checkpointId, () => this.options.controller.resume({ checkpoint_id: checkpointId, deadline_ts: this.options.deadline() }), tries);
    } catch (error) {
      if (!(error instanceof CheckpointError && error.code === "not_found")) throw error;
      this.options.logger.info({ checkpoint_id: checkpointId, err: error }, `${what}: nothing is left open to resume`);
    }
  }

  /**
   * Sends a controller op again (up to `maxTries`, a second apart) while it answers a code of
   * RESENT_CODES; any other error, or the last try's, is thrown.
   */
  async resent<T>(what: string, checkpointId: string | undefined, send: () => Promise<T>, maxTries = RESEND_TRIES): Promise<T> {
    for (let tries = 1; ; tries++) {
      try {
        return await send();
      } catch (error) {
        const code = error instanceof CheckpointError ? error.code : undefined;
        if (tries >= maxTries || code === undefined || !RESENT_CODES.has(code)) throw error;
        this.options.logger.warn({ ...(checkpointId !== undefined && { checkpoint_id: checkpointId }), code, tries }, `${what} did not answer for sure; sending it again`);
        await delay(this.options.pauses.resendS);
      }
    }
  }

  /**
   * Commits one of our checkpoints. Its outcome unknown (`outcome_unknown`, `not_leader`), it is
   * sent again only while the coordinator's status shows the checkpoint committed: a successor
   * re-drives a decided commit and keeps it committed for this controller, which gets its reply
   * from that state (nothing is sent again). Taken for a failure, it would be aborted (a SIGTERM's
   * stop checkpoint lost, every row restarted from input). A commit that failed at a participant
   * (over the wire its `outcome_unknown` looks the same) stays `committing`: not sent again, so a
   * hung participant does not keep the Gym parked for another deadline; our resume aborts it.
   */
  async commitOwn(checkpointId: string, scope: EpisodeId[], stop: boolean): Promise<CtlReplyOf<"commit">> {
    const send = () => this.options.controller.commit({ checkpoint_id: checkpointId, deadline_ts: this.options.deadline(), episode_ids: scope, stop });
    let lost: CheckpointError;
    try {
      return await send();
    } catch (error) {
      if (!(error instanceof CheckpointError && RESENT_CODES.has(error.code))) throw error;
      lost = error;
    }
    for (let tries = 1; tries < RESEND_TRIES; tries++) {
      await delay(this.options.pauses.resendS);
      // Unread (no leader serves yet): asked again after the next pause.
      const open = await this.options.controller.status().then(
        (status) => status.checkpoint,
        () => undefined,
      );
      if (open === undefined) continue;
      if (open?.checkpoint_id !== checkpointId || (open.phase !== "committed" && open.phase !== "published")) throw lost;
      this.options.logger.warn({ checkpoint_id: checkpointId, err: lost }, "commit did not answer, but the coordinator holds it committed; sending it again");
      return this.resent("commit", checkpointId, send);
    }
    throw lost;
  }

  /**
   * Publishes one of our checkpoints, sent again while its outcome is unknown: its coordinator
   * dying mid-publish leaves it to a successor, which keeps a decided checkpoint for this publish
   * (re-driving its commit, or answering from the published checkpoint.json). Taking the lost reply
   * for a failure would resume a published checkpoint (a stop checkpoint's parked Gym included)
   * and report it unpublished. A successor that no longer has it open (a stop checkpoint closes at
   * its publish) answers the retry from checkpoint.json, which names our state file and sha256; any
   * refusal still left (the retries ran out) is checked against the catalog (that read sent again
   * as the publish is): published with our state, it is no failure.
   */
  async publishOwn(checkpointId: string, sha256: string): Promise<void> {
    try {
      await this.resent("publish", checkpointId, () => this.options.controller.publish({ checkpoint_id: checkpointId, controller_state: { file: COLLECTION_STATE_FILE, sha256 } }));
    } catch (error) {
      // Sent again like the publish (a failover: no ready leader for a moment), so a refusal that says
      // nothing of the checkpoint is not taken for "not published".
      const read = () => this.options.controller.get(checkpointId);
      const ref = error instanceof CheckpointError ? await this.resent("get after publish", checkpointId, read).then((got) => got.manifest.controller_state, () => null) : null;
      if (!ref || !("file" in ref) || ref.file !== COLLECTION_STATE_FILE || ref.sha256 !== sha256) throw error;
      this.options.logger.warn({ checkpoint_id: checkpointId, err: error }, "publish did not answer, but the checkpoint is published with our collection state");
    }
  }
}

/** A resume the coordinator ran, which failed only at the participants its detail names (see combinedFailure). */
function failedAtSomeParticipants(err: unknown): boolean {
  return err instanceof CheckpointError && !RESENT_CODES.has(err.code) && err.message.startsWith(participantFailurePrefix("resume"));
}
