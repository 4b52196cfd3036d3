import { lstatSync, readdirSync, statSync, type Stats } from "node:fs";
import { lstat } from "node:fs/promises";
import { dirname, join } from "node:path";
import {
  isPassableEpoch,
  CheckpointError,
  CheckpointIdSchema,
  GLOBAL_MANIFEST_FILE,
  GlobalManifestSchema,
  schemaVersionMismatch,
  LATEST_FILE,
  MAX_GLOBAL_MANIFEST_BYTES,
  MAX_GLOBAL_MANIFEST_NESTING,
  PARTICIPANTS_DIR,
  describeZodError,
  jsonNestsDeeperThan,
  toCheckpointError,
  type CtlDamagedCheckpoint,
  type GlobalManifest,
} from "../../protocol/index.js";
import { readRegularFile, readRegularFileSync } from "./regular-file.js";

/** LATEST holds one checkpoint id (at most 128 characters) and a newline. */
const MAX_LATEST_BYTES = 4096;

/**
 * checkpoint.json is renamed into place by publication, never a link: one (out of the checkpoint,
 * or to another copy) would have restore and verify vouch for a file the checkpoint does not hold,
 * as the participants' manifests and records and the controller state file may not be either.
 */
const GLOBAL_MANIFEST_LIMITS = { maxBytes: MAX_GLOBAL_MANIFEST_BYTES, noFollow: true };

export interface CatalogEntry {
  checkpoint_id: string;
  published_at: number;
  epoch: number;
  participants: number;
  stop: boolean;
}

/** A checkpoint directory whose checkpoint.json is there but cannot be read or parsed: as `list` names it. */
export type DamagedCheckpoint = CtlDamagedCheckpoint;

/**
 * What a scan learnt from one version of a checkpoint.json: its entry, or why it is damaged (its
 * text does not parse or validate). Both stand until the file changes: a damaged one is never
 * rewritten by publication, and parsing it again (up to 64 MiB, blocking) on every scan would hold
 * the event loop for seconds after each publication and each `list`.
 */
type ScannedManifest = { version: string; entry: CatalogEntry } | { version: string; refusal: CheckpointError };

/** Reads the published checkpoints under a root: `<root>/<id>/checkpoint.json` and `<root>/LATEST`. */
export class CheckpointCatalog {
  private readonly entries = new Map<string, ScannedManifest>();
  /**
   * Aborted checkpoints whose checkpoint.json this leader's writer could not take back (its
   * `takeBack`; a successor's recovery adds those its predecessor left, learnt from the journal
   * entry kept for them). The file marks them published, so every read here withholds them: not
   * listed (nor as damaged), `get` not_found, not counted by retention, never the newest. Only
   * `has`/`published`/`leftover` still see the file: recovery and the prepare look for it. Kept by
   * the writer (GlobalManifestWriter.untakenBackOf), emptied with the leadership.
   */
  readonly untakenBack = new Set<string>();

  constructor(
    readonly root: string,
    /**
     * A file the root must hold: the deployment claim the daemon's start wrote (ROOT_DEPLOYMENT_FILE).
     * A root that is itself a mount point is an empty directory once unmounted, not a gone one.
     */
    private readonly claim?: string,
  ) {}

  /**
   * Throws unless the root is there (its ENOENT: storage_error) and holds `claim`: else its storage
   * is not mounted here, and the root must be read neither as "nothing published" (a controller
   * would start afresh past the checkpoints it holds) nor written into (checkpoints published on
   * this host's disk under the mount point, hidden once it is back). Blocking: one or two stats.
   */
  assertRootHeld(): void {
    statSync(this.root);
    if (this.claim === undefined || lstatSync(join(this.root, this.claim), { throwIfNoEntry: false })) return;
    throw new CheckpointError(
      "storage_error",
      `checkpoint root ${this.root} does not hold ${this.claim}, which this coordinator's start wrote there: its storage is not mounted here (an empty mount point) or was replaced, so nothing is read from or written to it; mount it again (a root emptied on purpose: restart the coordinator)`,
    );
  }

  dirFor(checkpointId: string): string {
    return join(this.root, CheckpointIdSchema.parse(checkpointId));
  }

  /**
   * The id LATEST names, or null when nothing was published yet. A root that is gone, or lost its
   * claim, is not that: the coordinator makes and claims it at its start, so it is the storage
   * unmounted, and a controller told "nothing published" would start afresh past what it holds:
   * thrown (storage_error, `assertRootHeld`).
   */
  async latest(): Promise<string | null> {
    let text: string;
    try {
      // Never through a symbolic link, as for checkpoint directories and state files: a LATEST
      // pointing at some other file would name whatever id that file's text spells.
      text = await readRegularFile(join(this.root, LATEST_FILE), { maxBytes: MAX_LATEST_BYTES, noFollow: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      this.assertRootHeld();
      return null;
    }
    const id = text.trim();
    const parsed = CheckpointIdSchema.safeParse(id);
    if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `${LATEST_FILE} does not name a checkpoint id`);
    return parsed.data;
  }

  /**
   * Whether the checkpoint has a checkpoint.json (valid or not: a corrupt one is still not a fresh
   * id). A checkpoint directory that is a symbolic link is not one this root holds (`get` refuses
   * it): `leftover` then refuses the id as not a directory, and recovery does not take it for a
   * published checkpoint. Blocking: an lstat and a stat, on the path of every prepare.
   */
  has(checkpointId: string): boolean {
    return !this.linked(checkpointId) && manifestAt(this.manifestPath(checkpointId)) !== "absent";
  }

  /**
   * has(), for a fresh id's prepare: a stat the storage refuses (EACCES on a root this process
   * cannot search, EIO) is thrown (`storage_error`), not taken for a published checkpoint, which
   * would refuse every fresh id as "already published".
   */
  published(checkpointId: string): boolean {
    if (this.linked(checkpointId)) return false;
    const found = manifestAt(this.manifestPath(checkpointId));
    if (found instanceof Error) throw toCheckpointError(found);
    return found === "present";
  }

  /** Whether `<root>/<id>` is a symbolic link (nothing there, or not to be seen: not one). Blocking: one lstat. */
  linked(checkpointId: string): boolean {
    try {
      return lstatSync(dirname(this.manifestPath(checkpointId))).isSymbolicLink();
    } catch {
      return false; // ENOENT, EACCES: the stat of checkpoint.json answers for it
    }
  }

  /**
   * What is at `<root>/<id>` for an id that is not published (no checkpoint.json): nothing or a
   * directory without participants' files (`"free"`: a controller may have written its state file
   * there already), the participants' directory an aborted attempt at this id left
   * (`"participants"`), or something that is not a directory (`"not_a_directory"`: a file, a link),
   * there or at the participants' directory (`"participants_not_a_directory"`: every commit would
   * fail to write through it, after the prepare parked everyone and the decision was journaled).
   * Blocking: one lstat on the path of every prepare.
   */
  leftover(checkpointId: string): "free" | "participants" | "not_a_directory" | "participants_not_a_directory" {
    const dir = this.dirFor(checkpointId);
    let info: Stats;
    try {
      info = lstatSync(dir);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return "free";
      throw error;
    }
    if (!info.isDirectory()) return "not_a_directory";
    try {
      return lstatSync(join(dir, PARTICIPANTS_DIR)).isDirectory() ? "participants" : "participants_not_a_directory";
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return "free";
      throw error;
    }
  }

  /** The global manifest of a published checkpoint; `not_found` when it has none, or is withheld (`untakenBack`). */
  async get(checkpointId: string): Promise<GlobalManifest> {
    const path = this.manifestPath(checkpointId);
    if (this.untakenBack.has(checkpointId)) {
      throw new CheckpointError("not_found", `checkpoint ${checkpointId} was aborted, not published: the storage refused the removal of its checkpoint.json, which is retried before the next retention`);
    }
    let text: string;
    try {
      // The coordinator makes real directories; a link (out of the root, or to another checkpoint)
      // is not one of its checkpoints: `scan` names it damaged instead of listing it.
      if ((await lstat(dirname(path))).isSymbolicLink()) throw linkedCheckpointDir(dirname(path));
      text = await readRegularFile(path, GLOBAL_MANIFEST_LIMITS);
    } catch (error) {
      throw readFailure(error, checkpointId, this.root);
    }
    return parseGlobalManifest(path, checkpointId, text);
  }

  /**
   * Directories under the root, split into published (valid checkpoint.json) and partial ones:
   * without checkpoint.json and recognisably a checkpoint's (empty, as opened, or holding the
   * participants' directory). Any other directory is not ours (a controller may share the root) and
   * is in neither list; nor is a link, unless it leads to a checkpoint.json (then it is damaged);
   * nor is an aborted checkpoint withheld (`untakenBack`).
   * Blocking: a readdir and a stat per checkpoint; checkpoint.json is written once (renamed into
   * place), so its parse is cached until its inode, size or mtime changes, and so is a damaged
   * one's refusal. Retention scans after every publication and must not re-read every manifest each time.
   */
  scan(): { published: CatalogEntry[]; partial: string[]; damaged: DamagedCheckpoint[] } {
    let names: string[];
    let links: string[];
    try {
      const idNamed = readdirSync(this.root, { withFileTypes: true }).filter((d) => CheckpointIdSchema.safeParse(d.name).success && !this.untakenBack.has(d.name));
      names = idNamed.filter((d) => d.isDirectory()).map((d) => d.name);
      links = idNamed.filter((d) => d.isSymbolicLink()).map((d) => d.name);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return { published: [], partial: [], damaged: [] };
      throw error;
    }
    const published: CatalogEntry[] = [];
    const partial: string[] = [];
    const damaged: DamagedCheckpoint[] = [];
    // A link to a checkpoint (its target holds a checkpoint.json) is not one this root holds (`get`
    // refuses it): named as damaged, so it neither vanishes from `ls` unexplained nor is deleted.
    // A link to anything else is not ours and is left out, as any other directory.
    for (const name of links) {
      if (manifestAt(this.manifestPath(name)) !== "absent") damaged.push({ checkpoint_id: name, code: "invalid_checkpoint_state", detail: linkedCheckpointDir(join(this.root, name)).message });
    }
    for (const name of names) {
      try {
        published.push(this.entry(name));
      } catch (error) {
        if (error instanceof CheckpointError && error.code === "not_found") {
          if (isCheckpointDir(join(this.root, name))) partial.push(name);
          continue;
        }
        // A corrupt or unreadable checkpoint.json is neither listed nor deleted: `ls` names it and
        // `verify` reports it in full.
        const refusal = toCheckpointError(error);
        damaged.push({ checkpoint_id: name, code: refusal.code, detail: refusal.message });
      }
    }
    const present = new Set(names);
    for (const name of this.entries.keys()) if (!present.has(name)) this.entries.delete(name);
    // Newest first, as repairLatest orders them: epochs only grow, and within one epoch one
    // coordinator's clock orders its publications (a successor's clock may lag its predecessor's).
    published.sort((a, b) => b.epoch - a.epoch || b.published_at - a.published_at || (a.checkpoint_id < b.checkpoint_id ? 1 : -1));
    return { published, partial: partial.sort(), damaged: damaged.sort((a, b) => (a.checkpoint_id < b.checkpoint_id ? -1 : 1)) };
  }

  /**
   * The highest epoch a published checkpoint here carries (0: none), for the lease's epoch floor.
   * Blocking, as scan(). One no later epoch can pass (2^53 - 1, a hand-edited checkpoint.json) is
   * left out, told to `outOfRange`: as the result, the floor would ignore it whole, the other
   * published epochs with it.
   */
  highestEpoch(outOfRange?: (checkpointId: string, epoch: number) => void): number {
    for (const entry of this.scan().published) {
      if (isPassableEpoch(entry.epoch)) return entry.epoch;
      outOfRange?.(entry.checkpoint_id, entry.epoch);
    }
    return 0;
  }

  /** The newest published checkpoint whose checkpoint.json reads back, whatever LATEST names. Blocking, as scan(). */
  newest(): CatalogEntry | undefined {
    return this.scan().published[0];
  }

  /** Caches the catalog entry of a checkpoint.json whose content and stat the caller already has. */
  remember(name: string, manifest: GlobalManifest, info: Stats): CatalogEntry {
    const entry = { checkpoint_id: name, published_at: manifest.published_at, epoch: manifest.epoch, participants: manifest.participants.length, stop: manifest.stop };
    this.entries.set(name, { version: fileVersion(info), entry });
    return entry;
  }

  private entry(name: string): CatalogEntry {
    const path = this.manifestPath(name);
    const cached = this.entries.get(name);
    let read: { text: string; info: Stats };
    try {
      // The common case (retention after every publication): unchanged since it was read, one stat.
      if (cached) {
        const info = lstatSync(path);
        if (info.isFile() && cached.version === fileVersion(info)) {
          if ("refusal" in cached) throw cached.refusal;
          return cached.entry;
        }
      }
      read = readRegularFileSync(path, GLOBAL_MANIFEST_LIMITS);
    } catch (error) {
      throw readFailure(error, name, this.root);
    }
    let manifest: GlobalManifest;
    try {
      manifest = parseGlobalManifest(path, name, read.text);
    } catch (error) {
      // Its text's fault alone (a read the storage refused is not cached: it may pass next time).
      if (error instanceof CheckpointError) this.entries.set(name, { version: fileVersion(read.info), refusal: error });
      throw error;
    }
    return this.remember(name, manifest, read.info);
  }

  private manifestPath(checkpointId: string): string {
    const parsedId = CheckpointIdSchema.safeParse(checkpointId);
    if (!parsedId.success) throw new CheckpointError("invalid_request", describeZodError(parsedId.error, `checkpoint id ${JSON.stringify(checkpointId)}`));
    return join(this.root, checkpointId, GLOBAL_MANIFEST_FILE);
  }
}

/** Whether a checkpoint.json is at `path`, valid or not (a link on the way followed), or the stat's error when the storage will not say. */
function manifestAt(path: string): "present" | "absent" | Error {
  try {
    statSync(path);
    return "present";
  } catch (error) {
    // ENOTDIR: the id names a stray file under the root, not a published checkpoint (as `get`
    // says); `leftover` then refuses it as not a directory.
    const code = (error as NodeJS.ErrnoException).code;
    return code === "ENOENT" || code === "ENOTDIR" ? "absent" : (error as Error);
  }
}

/** The coordinator makes real directories: a link (out of the root, or to another checkpoint) is not one of its checkpoints. */
function linkedCheckpointDir(dir: string): CheckpointError {
  return new CheckpointError("invalid_checkpoint_state", `checkpoint directory ${dir} is a symbolic link, not a checkpoint this root holds`);
}

/** Empty (opened, nothing committed) or holding the participants' directory that commits write. */
function isCheckpointDir(dir: string): boolean {
  try {
    const entries = readdirSync(dir, { withFileTypes: true });
    return entries.length === 0 || entries.some((e) => e.name === PARTICIPANTS_DIR && e.isDirectory());
  } catch {
    return false; // gone or unreadable: nothing to delete
  }
}

function fileVersion(info: Stats): string {
  return `${info.ino}:${info.size}:${info.mtimeMs}`;
}

/** A catalog error for a failed read: a missing file means the checkpoint is not published. */
function readFailure(error: unknown, checkpointId: string, root: string): Error {
  if (error instanceof CheckpointError) return error;
  // ENOTDIR: the id names a stray file under the root, not a checkpoint directory.
  const code = (error as NodeJS.ErrnoException).code;
  if (code === "ENOENT" || code === "ENOTDIR") return new CheckpointError("not_found", `checkpoint ${checkpointId} is not published under ${root}`);
  return error as Error;
}

function parseGlobalManifest(path: string, checkpointId: string, text: string): GlobalManifest {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new CheckpointError("invalid_checkpoint_state", `${path} is not valid JSON`);
  }
  // Checked without recursion, before anything walks it (schemas, digests, a reply's JSON.stringify).
  if (jsonNestsDeeperThan(value, MAX_GLOBAL_MANIFEST_NESTING)) {
    throw new CheckpointError("invalid_checkpoint_state", `${path} nests more than ${MAX_GLOBAL_MANIFEST_NESTING} levels deep`);
  }
  const otherVersion = schemaVersionMismatch(value, path);
  if (otherVersion) throw new CheckpointError("invalid_checkpoint_state", otherVersion);
  const parsed = GlobalManifestSchema.safeParse(value);
  if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `${path} is invalid: ${describeZodError(parsed.error)}`);
  if (parsed.data.checkpoint_id !== checkpointId) {
    throw new CheckpointError("invalid_checkpoint_state", `${path} belongs to checkpoint ${parsed.data.checkpoint_id}`);
  }
  return parsed.data;
}
