import { realpath, stat } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { z } from "zod";
import { CheckpointError } from "../../protocol/index.js";

/**
 * What tells one collection from another in a checkpoint root (whose `dispatched.jsonl` holds one):
 * the rows it runs, the file its finished rows go to and the ids it gives them. A coordinator keeps
 * one root, so a second job is usually another collection in the same root; taken for the restart
 * of the first, it retired the first's finished rows (deleting their ledgers) and sent them again.
 */
export interface CollectionIdentity {
  /** --tasks, resolved; unknown to a caller that reads no tasks file (tests). */
  tasks?: string;
  /** --out, resolved. */
  out: string;
  /** --rollout-id-prefix, "" for none. */
  rolloutIdPrefix: string;
}

/** A path as the collector resolved it (PATH_MAX). */
export const LoggedPathSchema = z.string().min(1).max(4096);
export const RolloutIdPrefixSchema = z.string().min(1).max(200);

/**
 * A collection as its files name it (dispatched.jsonl's header, collection.json): `tasks`, `out`
 * and `rollout_id_prefix`, the prefix left out when there is none.
 */
export const CollectionFieldsSchema = z
  .object({
    tasks: LoggedPathSchema.optional(),
    out: LoggedPathSchema,
    rollout_id_prefix: RolloutIdPrefixSchema.optional(),
  })
  .strict();
export type CollectionFields = z.infer<typeof CollectionFieldsSchema>;

export function collectionFields(identity: CollectionIdentity): CollectionFields {
  return {
    ...(identity.tasks !== undefined && { tasks: identity.tasks }),
    out: identity.out,
    ...(identity.rolloutIdPrefix && { rollout_id_prefix: identity.rolloutIdPrefix }),
  };
}

export function fromCollectionFields(fields: CollectionFields): CollectionIdentity {
  return { ...(fields.tasks !== undefined && { tasks: fields.tasks }), out: fields.out, rolloutIdPrefix: fields.rollout_id_prefix ?? "" };
}

/**
 * Whether the log's collection is this one. Paths are compared as written (resolved), or, spelled
 * otherwise (through a link, another relative path), by the file they name when both exist, or by
 * their directory's real path and name when neither exists yet (an --out before its first row). A log
 * older than the header naming its collection (`logged` undefined) counts as this one: an upgrade
 * mid-run still resumes.
 */
export async function sameCollection(logged: CollectionIdentity | undefined, current: CollectionIdentity): Promise<boolean> {
  if (!logged) return true;
  if (logged.rolloutIdPrefix !== current.rolloutIdPrefix) return false;
  if (!(await samePath(logged.out, current.out))) return false;
  return logged.tasks === undefined || current.tasks === undefined || (await samePath(logged.tasks, current.tasks));
}

/** Whether `a` and `b` name one file, or (neither there yet) the same file to be. */
export async function samePath(a: string, b: string): Promise<boolean> {
  if (a === b) return true;
  const [x, y] = await Promise.all([stat(a).catch(() => undefined), stat(b).catch(() => undefined)]);
  if (x !== undefined && y !== undefined) return x.dev === y.dev && x.ino === y.ino;
  // Neither there yet (an --out before its first finished row): the same name in the same directory,
  // however spelled, is the same file to be, as it would be once created.
  if (x === undefined && y === undefined) {
    const [p, q] = await Promise.all([realName(a), realName(b)]);
    return p !== undefined && p === q;
  }
  return false;
}

/** `path` with its directory resolved through links, or undefined when that directory is not there. */
async function realName(path: string): Promise<string | undefined> {
  const dir = await realpath(dirname(path)).catch(() => undefined);
  return dir === undefined ? undefined : join(dir, basename(path));
}

/** The flags a collection was started with, as a command line names them. */
export function collectionFlags(identity: CollectionIdentity): string {
  return [
    ...(identity.tasks !== undefined ? [`--tasks ${identity.tasks}`] : []),
    `--out ${identity.out}`,
    ...(identity.rolloutIdPrefix ? [`--rollout-id-prefix ${identity.rolloutIdPrefix}`] : []),
  ].join(" ");
}

/**
 * The refusal of a start whose log is another collection's: nothing is read further, retired,
 * restored or written, and the detail names both ways on.
 */
export function anotherCollection(logPath: string, runId: string, logged: CollectionIdentity, current: CollectionIdentity): CheckpointError {
  return new CheckpointError(
    "checkpoint_conflict",
    `${logPath} is another collection's (run ${runId}: ${collectionFlags(logged)}), not this one's (${collectionFlags(current)}); ` +
      `to continue that collection, run its command again; to start this one instead, pass --new-collection ` +
      `(the earlier collection's unfinished attempts are retired, its finished rows and their ledgers kept, nothing of it restored)`,
  );
}
