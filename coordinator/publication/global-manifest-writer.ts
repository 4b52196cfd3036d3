import { createHash } from "node:crypto";
import { createReadStream, lstatSync, renameSync, statSync } from "node:fs";
import { mkdir, rm, rmdir, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import {
  CheckpointError,
  GLOBAL_MANIFEST_FILE,
  LATEST_FILE,
  MANIFEST_SCHEMA_VERSION,
  MAX_CONTROLLER_STATE_FILE_BYTES,
  MAX_GLOBAL_MANIFEST_BYTES,
  PARTICIPANTS_DIR,
  isUnreadableStorage,
  type ControllerState,
  type ControllerStateInput,
  type EpisodeId,
  type GlobalManifest,
  type ParticipantEntry,
  jsonTextWithin,
} from "../../protocol/index.js";
import type { CheckpointCatalog } from "./checkpoint-catalog.js";
import { discardStagedFile, fsyncDirectory, fsyncDirectoryInPool, replaceSmallFileDurably, stageSmallFile, tempPathFor, type StagedFile } from "./durable-fs.js";
import { sha256RegularFile } from "./regular-file.js";
import { applyRetention, linkToTrash, removeTrash, trashCheckpointDir } from "./retention.js";

export interface PublishInput {
  checkpointId: string;
  epoch: number;
  preparedAt: number;
  publishedAt: number;
  stop: boolean;
  scope: EpisodeId[] | null;
  restarts: string[];
  participants: ParticipantEntry[];
  controllerState: ControllerStateInput | null;
  /** Called before checkpoint.json is written, before it is renamed into place and before LATEST is renamed; throwing (e.g. leadership lost) stops there. */
  beforeWrite?: () => void;
}

export interface PublishResult {
  manifestPath: string;
  manifest: GlobalManifest;
}

/** One checkpoint's staging: its directory's mkdir (what a commit waits for) and LATEST's temp file. */
interface Staging {
  directory: Promise<unknown>;
  latest: Promise<StagedFile>;
}

/**
 * Publication, only after every commit succeeded: the global checkpoint.json last in the checkpoint
 * directory, then LATEST atomically replaced at the root; the caller runs retention (`retain`)
 * when it suits it (the convenience op: after the resume).
 *
 * LATEST's new content (the id) is known when the checkpoint opens, so `stage` creates the
 * checkpoint directory (root fsynced) and writes and fsyncs LATEST's temp file while the prepare
 * and commit requests are in flight (the commits wait for the mkdir alone: `checkpointDirectory`);
 * publication then pays one fsynced file (checkpoint.json) and one directory fsync before LATEST's
 * rename, whose root fsync runs in the background (`durable`).
 * The order on disk is unchanged: LATEST is renamed only after checkpoint.json is durable.
 */
export class GlobalManifestWriter {
  private readonly staged = new Map<string, Staging>();
  private readonly inUse = new Set<string>();
  /** Checkpoints whose last publication failed, until closed or published (see discard). */
  private readonly publicationFailed = new Set<string>();
  /** Aborted checkpoints whose checkpoint.json and directory both stayed (see takeBack): the catalog's, which withholds them from its readers. */
  private get untakenBack(): Set<string> {
    return this.catalog.untakenBack;
  }
  private cleanup: Promise<void> = Promise.resolve();
  private latestDurable: Promise<void> = Promise.resolve();

  constructor(
    private readonly catalog: CheckpointCatalog,
    private readonly retention: number,
    /** Told when renaming a checkpoint away or removing deleted checkpoints' files fails (retried after the next publication); a full disk should not be silent. */
    private readonly onCleanupError?: (error: unknown) => void,
  ) {}

  /** Starts writing (and fsyncing) the checkpoint directory and LATEST's temp file for `checkpointId`. */
  stage(checkpointId: string): void {
    if (this.staged.has(checkpointId)) return;
    const directory = makeCheckpointDirectory(this.catalog, checkpointId);
    directory.catch(() => undefined); // surfaced by checkpointDirectory and publish
    const latest = this.stageLatest(checkpointId, directory);
    latest.catch(() => undefined); // surfaced by publish; a discarded stage needs no handler
    this.staged.set(checkpointId, { directory, latest });
  }

  /**
   * Settles once the checkpoint directory exists (staging it now if nothing is: a successor's
   * re-driven commit), before any commit is sent: a participant that does not see it (its checkpoint
   * storage not mounted on its host) refuses the commit instead of writing to its local disk. Only
   * the mkdir is awaited, normally done during the prepare; the fsyncs are publication's. A failed
   * mkdir is staged again once, so a passing failure does not refuse every retried commit; a second
   * failure is thrown. A mkdir that succeeded is checked again (`stillStaged`): the directory may
   * have been removed since. `decided`: commits may have been sent into it already.
   */
  async checkpointDirectory(checkpointId: string, options: { decided?: boolean } = {}): Promise<void> {
    this.stage(checkpointId);
    const staging = this.staged.get(checkpointId)!;
    let made = true;
    await staging.directory.catch(() => {
      made = false; // made again below
    });
    if (made) return this.stillStaged(checkpointId, options.decided === true);
    if (this.staged.get(checkpointId) === staging) {
      // Nothing of that staging is on disk (LATEST's temp file is written only after the mkdir).
      this.staged.delete(checkpointId);
      this.stage(checkpointId);
    }
    // Staged again (here or meanwhile), or dropped while the mkdir ran (leadership lost, the
    // checkpoint closed): staging that one again would leave a LATEST temp file nobody removes (this
    // process's sweeps skip what it staged), so only its directory is made; a publication stages afresh.
    const again = this.staged.get(checkpointId)?.directory ?? makeCheckpointDirectory(this.catalog, checkpointId);
    await again.catch((error: unknown) => {
      // Not a storage failure (storage_error): the path, as the prepare's own check refuses it.
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      throw this.notADirectory(checkpointId, error);
    });
  }

  /**
   * The staged directory, made during the prepare, may be gone by the commit (an operator's cleanup,
   * another tool's retention, the storage remounted): every participant would refuse the commit
   * (storage_error, the directory not visible) though nothing is lost. Nothing is in it before the
   * first commit, so it is made again, and the root fsynced before any commit is sent into it, as
   * staging does. Not once the commit is decided: commits may have written into the directory
   * removed, and the rest committing into a new one would publish a checkpoint naming files that
   * are gone; that commit is refused (storage_error), and the checkpoint can only be abandoned.
   * Only the directory: a missing root is the storage gone, which the mkdir's ENOENT refuses
   * (storage_error), rather than a root made again on this host's local disk. Something not
   * a directory in its place (a file, a link, as the prepare's check refuses) is refused, and left
   * as it is.
   * One lstat when the directory is there: blocking, as the prepare's check of the same path is, so
   * the commit does not queue in the thread pool behind the staging's fsyncs still in flight.
   */
  private async stillStaged(checkpointId: string, decided: boolean): Promise<void> {
    const dir = this.catalog.dirFor(checkpointId);
    const info = lstatSync(dir, { throwIfNoEntry: false });
    if (info?.isDirectory()) return;
    if (info) throw this.notADirectory(checkpointId);
    if (decided) throw this.removedAfterCommits(checkpointId, "its commit was decided", "completed");
    this.catalog.assertRootHeld();
    try {
      await mkdir(dir);
    } catch (error) {
      // Made meanwhile (a concurrent re-drive): fine if it is a directory.
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      if (!lstatSync(dir).isDirectory()) throw this.notADirectory(checkpointId, error);
    }
    await fsyncDirectory(this.catalog.root);
  }

  /** The checkpoint directory gone once commits may have written into it: their files may be gone with it. */
  private removedAfterCommits(checkpointId: string, since: string, step: "completed" | "published"): CheckpointError {
    return new CheckpointError(
      "storage_error",
      `ENOENT: ${this.catalog.dirFor(checkpointId)} was removed after ${since}: what the participants committed into it may be gone, so the checkpoint cannot be ${step}; resume it (abandoning it) and take another`,
    );
  }

  private notADirectory(checkpointId: string, cause?: unknown): CheckpointError {
    return new CheckpointError("checkpoint_conflict", `${this.catalog.dirFor(checkpointId)} exists and is not a directory: nothing was committed`, { cause });
  }

  /**
   * Drops what `stage` wrote (the checkpoint was resumed without being published): the temp file,
   * and the checkpoint directory if nothing was committed into it.
   */
  discard(checkpointId: string, mayDelete?: () => boolean): Promise<void> {
    const staging = this.staged.get(checkpointId);
    // A publication that failed dropped its staging (and took its checkpoint.json back): its directory is still ours to clear.
    const publicationFailed = this.publicationFailed.delete(checkpointId);
    if (!staging && !publicationFailed) return this.cleanup;
    this.staged.delete(checkpointId);
    this.cleanup = this.cleanup.then(async () => {
      if (staging) await this.removeStagedTemp(staging.latest);
      const dir = this.catalog.dirFor(checkpointId);
      const removed = await rmdir(dir).then(
        () => true,
        () => false, // not empty: something was committed
      );
      // Abandoned by its leader (`mayDelete`: resumed unpublished, its decision withdrawn or never
      // made, still leading): what was committed into it is taken away now, not left for the next
      // publication's retention, which on a disk that checkpoints filled may never come while each
      // failed attempt leaves more. Only a partial checkpoint (no checkpoint.json, the participants'
      // gym/), and of it only gym/: the rest of the directory is the controller's (its state file,
      // docs/api.md), as a fresh prepare's clean-up of an earlier attempt leaves it; the directory
      // goes once nothing else is in it.
      if (removed || !mayDelete?.()) return;
      try {
        // Looked into inside the try: a lookup refused (EIO, EACCES; ENOTDIR, a file in its place)
        // is a clean-up failure, not a rejected clean-up chain that skips every later one.
        if (!isPartialCheckpoint(dir)) return;
        trashCheckpointDir(this.catalog.root, checkpointId, PARTICIPANTS_DIR);
        await rmdir(dir).catch(() => undefined); // not empty: the controller's files stay
        await removeTrash(this.catalog.root, this.inUse, mayDelete);
      } catch (error) {
        this.onCleanupError?.(error); // left for the next publication's retention
      }
    });
    return this.cleanup;
  }

  /**
   * Drops every staged LATEST temp file, leadership being lost: the successor publishes with its
   * own, and no sweep removes these (this process's are in `inUse`, which its own sweeps skip). The
   * checkpoint directories stay: the successor may re-drive a commit into them (so does a
   * checkpoint.json not taken back yet).
   */
  discardStagedLatest(): Promise<void> {
    const stagings = [...this.staged.values()].map((staging) => staging.latest);
    this.staged.clear();
    // A successor may complete one whose decision stayed journaled: its checkpoint.json is its own now.
    // One whose decision was withdrawn kept its entry (undecided): the successor's recovery takes it back.
    this.untakenBack.clear();
    // Their directories are the successor's now, as are the staged ones'.
    this.publicationFailed.clear();
    this.cleanup = this.cleanup.then(async () => {
      for (const staging of stagings) await this.removeStagedTemp(staging);
    });
    return this.cleanup;
  }

  /** Removes LATEST's temp file a staging wrote (none when the staging failed). */
  private async removeStagedTemp(staging: Promise<StagedFile>): Promise<void> {
    const staged = await staging.catch(() => undefined);
    if (!staged) return;
    await discardStagedFile(staged);
    this.inUse.delete(staged.temp);
  }

  async publish(input: PublishInput): Promise<PublishResult> {
    const dir = this.catalog.dirFor(input.checkpointId);
    // Not staged any more (a publication that failed dropped it): every commit went into the
    // directory, so it must still be there. Staging makes a missing one again, and checkpoint.json
    // would name the participants' files that went with it (as stillStaged refuses after a decision).
    if (!this.staged.has(input.checkpointId) && !lstatSync(dir, { throwIfNoEntry: false })?.isDirectory()) {
      throw this.removedAfterCommits(input.checkpointId, "its commits", "published");
    }
    this.stage(input.checkpointId);
    const staging = this.staged.get(input.checkpointId)!.latest;
    this.staged.delete(input.checkpointId);
    let latest: StagedFile | undefined;
    let manifestPath: string | undefined;
    /** checkpoint.json may be in place (its rename was allowed). */
    let renamed = false;
    try {
      latest = await staging; // also created the checkpoint directory
      // The state file is fsynced here: a controller may have written it without, and LATEST must
      // never name a checkpoint whose files a power loss can still take back.
      const controllerState = await this.resolveControllerState(dir, input.controllerState, true);
      // Not re-parsed here: every field was validated where it entered (commit replies, the
      // controller's request, prepare replies), and every reader parses the file. A cold zod pass
      // over 64 entries costs 0.5–6 ms on the publication's critical path.
      const manifest: GlobalManifest = {
        schema_version: MANIFEST_SCHEMA_VERSION,
        checkpoint_id: input.checkpointId,
        epoch: input.epoch,
        prepared_at: input.preparedAt,
        published_at: input.publishedAt,
        stop: input.stop,
        scope: input.scope,
        restarts: [...new Set(input.restarts)].sort(),
        participants: [...input.participants].sort((a, b) => (a.kind + "/" + a.instance < b.kind + "/" + b.instance ? -1 : 1)),
        controller_state: controllerState,
      };
      // Each commit reply is bounded, not their sum: a checkpoint.json every reader refuses (restore,
      // get, verify) must not become LATEST. Past the longest string (hundreds of participants with
      // 1 MiB replies) JSON.stringify throws V8's RangeError: refused alike, not internal_error.
      const tooLarge = (size: string) =>
        new CheckpointError("payload_too_large", `${GLOBAL_MANIFEST_FILE} of checkpoint ${input.checkpointId} would be ${size}, over the ${MAX_GLOBAL_MANIFEST_BYTES}-byte limit its readers enforce`);
      const text = `${jsonTextWithin(manifest, () => tooLarge("longer than the longest string"), 2)}\n`;
      const size = Buffer.byteLength(text);
      if (size > MAX_GLOBAL_MANIFEST_BYTES) throw tooLarge(`${size} bytes`);
      input.beforeWrite?.();
      // Checked again after the fsync's wait, before each rename: a successor that took over
      // meanwhile publishes (or repairs LATEST) itself.
      manifestPath = join(dir, GLOBAL_MANIFEST_FILE);
      await replaceSmallFileDurably(manifestPath, text, () => {
        input.beforeWrite?.();
        renamed = true;
      });
      // Read before LATEST's rename: once LATEST names it, the publication must not fail.
      const written = statSync(manifestPath);
      input.beforeWrite?.();
      // The replaced LATEST is freed in the background, not by the rename on the event loop while
      // the resume's replies arrive.
      const replaced = linkToTrash(this.catalog.root, LATEST_FILE);
      renameSync(latest.temp, latest.target);
      if (replaced) this.cleanup = this.cleanup.then(() => rm(replaced, { force: true })).catch((error: unknown) => this.onCleanupError?.(error));
      // The root's fsync (LATEST's rename) leaves the critical path: until it is done the journal
      // entry stays (the engine removes it after `durable()`), so after an OS crash that lost the
      // rename, recovery finds checkpoint.json and repairs LATEST (repairLatest).
      const durable = fsyncDirectoryInPool(this.catalog.root);
      durable.catch(() => undefined); // reported through durable()
      this.latestDurable = durable;
      // Retention scans the catalog right after this; it need not re-read what was just written.
      this.catalog.remember(input.checkpointId, manifest, written);
      this.publicationFailed.delete(input.checkpointId);
      // An earlier attempt's checkpoint.json nothing could take back is this published one now: not
      // for the next retention to take away (with LATEST naming it).
      this.untakenBack.delete(input.checkpointId);
      return { manifestPath, manifest };
    } catch (error) {
      this.publicationFailed.add(input.checkpointId);
      latest ??= await staging.catch(() => undefined);
      if (latest) await discardStagedFile(latest);
      // Renamed into place before the failure (its directory's fsync failed): a checkpoint.json
      // marks a checkpoint published, which LATEST never named and the engine now aborts. Not by a
      // writer deposed meanwhile (the wait for that fsync can outlast the lease): its successor
      // recovers the journaled decision, and may already have found this file and made it LATEST.
      if (manifestPath !== undefined && renamed && stillAllowed(input.beforeWrite)) await this.takeBack(input.checkpointId, manifestPath);
      throw directoryInTheWay(error);
    } finally {
      if (latest) this.inUse.delete(latest.temp);
    }
  }

  /**
   * Takes back the checkpoint.json of a publication that failed after its rename: left in place, it
   * would mark an aborted checkpoint published (listed, restorable by id, counted by retention, the
   * newest that reads back). The removal is made durable by the directory's fsync: a crash before
   * that reaches the disk brings the file back. Its removal (or that fsync) failing too, the whole
   * checkpoint directory goes to the trash retention sweeps: one rename at the root, atomic, so at
   * no point (a crash included) is there a half-removed checkpoint; its partial files would be
   * retention's to delete anyway. That failing as well, it is retried before the next retention scan,
   * and the engine keeps the checkpoint's journal entry (untakenBackOf) for a successor to take it back.
   */
  private async takeBack(checkpointId: string, manifestPath: string): Promise<boolean> {
    try {
      await rm(manifestPath, { force: true });
      await fsyncDirectory(dirname(manifestPath));
      this.untakenBack.delete(checkpointId);
      return true;
    } catch {
      // The directory instead, below.
    }
    try {
      trashCheckpointDir(this.catalog.root, checkpointId);
      this.untakenBack.delete(checkpointId);
    } catch (error) {
      // Also kept by the engine: the checkpoint's journal entry stays (undecided) while this id is
      // listed here (untakenBackOf), so a successor's recovery takes it back (takeBackAborted).
      this.untakenBack.add(checkpointId);
      this.onCleanupError?.(error);
      return false;
    }
    // Best effort: the rename is done. Failing, nothing to retry (untakenBack would add nothing): the
    // next checkpoint's staging fsyncs the root (one checkpoint is open at a time, so after this) and
    // its publication fails unless that fsync succeeded, so the rename is durable before any later
    // publication or retention scan. A crash before then can still bring checkpoint.json back.
    await fsyncDirectory(this.catalog.root).catch(() => undefined);
    return true;
  }

  /**
   * Whether the checkpoint.json of aborted checkpoint `checkpointId` could not be taken back (see
   * takeBack) and this writer has not managed it since (retain retries it): its journal entry must
   * stay, undecided, for whoever recovers next (this list goes with the leadership).
   */
  untakenBackOf(checkpointId: string): boolean {
    return this.untakenBack.has(checkpointId);
  }

  /**
   * Recovery of an undecided checkpoint (its journal entry `open`) whose directory holds a
   * checkpoint.json: never a legitimate one, as publication comes only after the decision, so it is
   * an aborted publication's its leader could not take back (or died before it did). Taken back as
   * the publication does (the file, else the whole directory to the trash); resolves false if
   * neither could be done, the id then kept for this writer's next retain (and the entry by the engine).
   */
  async takeBackAborted(checkpointId: string): Promise<boolean> {
    const manifestPath = join(this.catalog.dirFor(checkpointId), GLOBAL_MANIFEST_FILE);
    let present = true;
    try {
      present = lstatSync(manifestPath, { throwIfNoEntry: false }) !== undefined;
    } catch {
      // Unreadable (EIO, EACCES): taken back below if the storage lets us, else kept.
    }
    return present ? this.takeBack(checkpointId, manifestPath) : true;
  }

  /**
   * Recovery of a checkpoint whose checkpoint.json is there (made durable here before LATEST names it): a crash between that write and
   * LATEST's rename left LATEST naming an older checkpoint (or none); point it here, durably. A
   * LATEST naming a newer checkpoint stays: then this checkpoint was closed since and its journal
   * entry outlived the close ("superseded"). So does a LATEST that names nothing readable (missing,
   * damaged, or naming a damaged checkpoint.json) while a newer checkpoint reads back: that entry's
   * older checkpoint must not replace it.
   */
  /**
   * `beforeWrite` (the leadership check) runs before LATEST is read and again right before its
   * rename, with nothing awaited in between: a recovery that outlived its term must not move LATEST
   * back past what its successor published meanwhile.
   */
  async repairLatest(checkpointId: string, beforeWrite?: () => void): Promise<"current" | "repaired" | "superseded"> {
    beforeWrite?.();
    // Damaged: repaired below. Refused by the storage (EIO, a stale NFS handle during the failover):
    // passed on, since it may name a newer checkpoint that LATEST must not be moved back from.
    const latest = await this.catalog.latest().catch((error: unknown) => (isUnreadableStorage(error) ? Promise.reject(error) : null));
    if (latest === checkpointId) {
      // Read back from the page cache, perhaps before its rename was durable (the predecessor died
      // during the background fsync): make it so before the journal entry goes.
      await fsyncDirectory(this.catalog.root);
      return "current";
    }
    const ours = await this.catalog.get(checkpointId);
    const theirs =
      latest === null ? undefined : await this.catalog.get(latest).catch((error: unknown) => (isUnreadableStorage(error) ? Promise.reject(error) : undefined));
    // What LATEST named is unknown: the newest checkpoint that reads back stands in for it.
    const newest = theirs ?? this.catalog.newest();
    if (newest && publishedAfter(newest, ours)) return "superseded";
    // Its writer may have died between checkpoint.json's rename and its directory's fsync (read back
    // from the page cache here): made durable before LATEST names it, as publication orders them.
    await fsyncDirectory(this.catalog.dirFor(checkpointId));
    await replaceSmallFileDurably(join(this.catalog.root, LATEST_FILE), `${checkpointId}\n`, beforeWrite);
    return "repaired";
  }

  /**
   * Keeps the newest N published checkpoints (never `latest`) and deletes partial ones. Deleted
   * checkpoints leave the catalog before this returns (a rename each, blocking: a few metadata
   * operations); their files are removed in the background (`settled` awaits that).
   * `stillLeading` is asked again by that background sweep before it takes a crashed writer's LATEST
   * temp file: by then it may be a successor's (removeTrash).
   */
  retain(latest: string, stillLeading: () => boolean = () => true): string[] {
    // Aborted checkpoints whose checkpoint.json could not be taken back: before the scan counts them.
    for (const id of [...this.untakenBack]) {
      try {
        if (lstatSync(this.catalog.dirFor(id), { throwIfNoEntry: false })) trashCheckpointDir(this.catalog.root, id);
        this.untakenBack.delete(id);
      } catch (error) {
        this.onCleanupError?.(error);
      }
    }
    const deleted = applyRetention(this.catalog, this.retention, new Set([latest]), (_id, error) => this.onCleanupError?.(error));
    this.cleanup = this.cleanup
      .then(() => removeTrash(this.catalog.root, this.inUse, stillLeading))
      .catch((error: unknown) => this.onCleanupError?.(error)); // retried after the next publication
    return deleted;
  }

  /**
   * Resolves once the last publication's LATEST rename is durable (the root directory fsynced);
   * rejects if that fsync failed.
   */
  durable(): Promise<void> {
    return this.latestDurable;
  }

  /** Resolves once background work (staging, discarding stages, removing deleted checkpoints) has finished. */
  async settled(): Promise<void> {
    await Promise.all([...this.staged.values()].map((staging) => staging.latest.catch(() => undefined)));
    await Promise.all([this.cleanup, this.latestDurable.catch(() => undefined)]);
  }

  /** `directory`: the checkpoint directory's mkdir, started by `stage`. */
  private async stageLatest(checkpointId: string, directory: Promise<unknown>): Promise<StagedFile> {
    const target = join(this.catalog.root, LATEST_FILE);
    const temp = tempPathFor(target);
    // Reserved before it exists, so background removal of leftovers never takes it.
    this.inUse.add(temp);
    try {
      await directory;
      // The root's fsync makes the new checkpoint directory durable before anything is committed
      // into it (publication does not fsync the root before the resume).
      // Blocking opens and writes, fsyncs in the pool: this runs while the first prepare stage's
      // replies arrive, and each async fs call would be a thread-pool round trip of its own.
      const [staged, rootSynced] = await Promise.allSettled([stageSmallFile(target, `${checkpointId}\n`, temp), fsyncDirectoryInPool(this.catalog.root)]);
      if (staged.status === "rejected") throw staged.reason;
      if (rootSynced.status === "rejected") {
        // Not left for the sweep: nothing else would ever remove it while this process runs (inUse).
        await discardStagedFile(staged.value);
        throw rootSynced.reason;
      }
      return staged.value;
    } catch (error) {
      this.inUse.delete(temp);
      throw error;
    }
  }

  /**
   * Refuses a controller state `publish` would refuse for `checkpointId` (a file missing, not a
   * regular file, or with another sha256), so an op can check it before it sends anything.
   */
  async checkControllerState(checkpointId: string, input: ControllerStateInput | null): Promise<void> {
    await this.resolveControllerState(this.catalog.dirFor(checkpointId), input);
  }

  private async resolveControllerState(dir: string, input: ControllerStateInput | null, sync = false): Promise<ControllerState | null> {
    if (input === null) return null;
    if ("inline" in input) return { inline: input.inline ?? null };
    let digest: string;
    try {
      digest = await controllerStateDigest(dir, input.file, sync);
    } catch (error) {
      // It is there but the storage refuses its read (EACCES, EIO): storage_error, not "put it there and retry".
      if (error instanceof CheckpointError || isUnreadableStorage(error)) throw error;
      // Named with the id (generated when the op named none) and where it is looked for, so the
      // controller can put it there and send the op again under that id.
      throw new CheckpointError("not_found", `controller state file ${input.file} is not in checkpoint ${basename(dir)}'s directory: ${join(dir, input.file)} does not exist; write it there and retry with that checkpoint id`, { cause: error });
    }
    if (input.sha256 !== undefined && input.sha256 !== digest) {
      throw new CheckpointError("invalid_checkpoint_state", `controller state file ${input.file} has sha256 ${digest}, not ${input.sha256}`);
    }
    return { file: input.file, sha256: digest };
  }
}

/**
 * The checkpoint directory's mkdir, never its parents: the root is made once, by the daemon's start.
 * A root missing now is the checkpoint storage gone (unmounted, its mount point left empty), which
 * the mkdir's ENOENT refuses (storage_error), as `stillStaged` does; `mkdir -p` would make the root
 * again on this host's local disk, where a participant on the same host would commit and the
 * checkpoint be published, hidden under the mount point once the storage is back (LATEST there
 * naming an older one), and where nothing fsyncs the parents it made. One already there as a
 * directory is fine (a retried staging, a successor's re-drive); anything else there is EEXIST.
 */
async function makeCheckpointDirectory(catalog: CheckpointCatalog, checkpointId: string): Promise<void> {
  const dir = catalog.dirFor(checkpointId);
  // A root that is itself the mount point is still there unmounted, empty: its claim file is not.
  catalog.assertRootHeld();
  try {
    await mkdir(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EEXIST" || !(await stat(dir)).isDirectory()) throw error;
  }
}

/** A checkpoint directory holding the participants' files but no checkpoint.json (what retention deletes as partial). */
function isPartialCheckpoint(dir: string): boolean {
  return lstatSync(join(dir, GLOBAL_MANIFEST_FILE), { throwIfNoEntry: false }) === undefined && lstatSync(join(dir, PARTICIPANTS_DIR), { throwIfNoEntry: false })?.isDirectory() === true;
}

/** Whether `a` was published after `b`: epochs only grow; within one epoch one coordinator's clock orders its publications. */
function publishedAfter(a: { epoch: number; published_at: number }, b: { epoch: number; published_at: number }): boolean {
  return a.epoch > b.epoch || (a.epoch === b.epoch && a.published_at > b.published_at);
}

/** Whether `beforeWrite` (the leadership check) still passes. */
function stillAllowed(beforeWrite: (() => void) | undefined): boolean {
  try {
    beforeWrite?.();
    return true;
  } catch {
    return false;
  }
}

/**
 * sha256 of the controller state file `file` in checkpoint directory `dir`: a regular file there,
 * not a symbolic link (which could point out of the checkpoint), within
 * MAX_CONTROLLER_STATE_FILE_BYTES; anything else is `invalid_checkpoint_state`, a missing file
 * the open's ENOENT. `sync` fsyncs it as well (publication).
 */
export function controllerStateDigest(dir: string, file: string, sync = false): Promise<string> {
  return sha256RegularFile(join(dir, file), { maxBytes: MAX_CONTROLLER_STATE_FILE_BYTES, noFollow: true }, { sync });
}

/** sha256 of any file, following links (a library helper; checkpoint files use `controllerStateDigest`). */
export async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of createReadStream(path) as AsyncIterable<Buffer>) hash.update(chunk);
  return hash.digest("hex");
}

/**
 * A directory where LATEST or checkpoint.json goes refuses their rename (EISDIR): the storage's
 * layout, which its operator fixes, so `storage_error` as for any file publication cannot write
 * (not `internal_error`; protocol-wide EISDIR stays unmapped: user-given paths answer `invalid_request`).
 */
function directoryInTheWay(error: unknown): unknown {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  if (code !== "EISDIR" || !(error instanceof Error)) return error;
  return new CheckpointError("storage_error", `${error.message}: a directory holds that path; move it away`, { cause: error });
}
