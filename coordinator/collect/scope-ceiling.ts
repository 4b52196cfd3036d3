import { CheckpointError, MAX_ATTEMPT, MAX_CHECKPOINT_DIR_CHARS, MAX_CHECKPOINT_ID_CHARS, MAX_INCARNATION_CHARS, MAX_INSTANCE_CHARS, MAX_ROLLOUT_ID_CHARS, MAX_SCOPE, type EpisodeId, type Kind } from "../../protocol/index.js";
import { MAX_JOURNAL_ENTRY_BYTES, type JournalEntry } from "../ha/decision-journal.js";
import { COLLECTION_STATE_FILE } from "./collection-state.js";

/**
 * The most rows a collection may have in flight, so that every checkpoint's scope fits.
 *
 * A checkpoint's scope (the rows in flight, plus restored rows not sent yet; `RowQueue` sends
 * those first, so they never add to a full set of workers) travels in one control message: the
 * commit request (1 MiB), the coordinator's commit to each participant (1 MiB), and before that
 * the decision journal's entry, which the coordinator refuses `payload_too_large` past
 * MAX_JOURNAL_ENTRY_BYTES (1 MiB less 16 KiB of room for those messages' other fields and
 * headers). The entry is the tightest: it holds the scope, the restarts prepare reported (capture
 * keys of in-flight episodes left out of the scope: a row is in one list or the other, and its
 * capture key is shorter than its scope entry) and the rest, which grows with the deployment's
 * members. So a row costs at most one scope entry with the collection's longest rollout id and
 * the last attempt there is, and the rest is budgeted at its schema maximum for MEMBER_ROOM members.
 * Past the ceiling every checkpoint was refused `payload_too_large` and the run never checkpointed.
 */

/** Members (participants) the journal entry's other fields are budgeted for: Gym servers × kinds. */
export const MEMBER_ROOM = 256;
/** The longest kind's name. */
const LONGEST_KIND: Kind = "environment";

/** Bytes one scope entry takes at most in compact JSON, its separating comma included (ids are ASCII). */
export function worstScopeEntryBytes(rolloutIdChars: number): number {
  const entry: EpisodeId = { rollout_id: "x".repeat(rolloutIdChars), attempt: MAX_ATTEMPT };
  return Buffer.byteLength(JSON.stringify(entry)) + 1;
}

/**
 * The journal entry of a checkpoint of ours with an empty scope and no restarts, every other field
 * at its longest: what the rows' entries must leave room for.
 */
export function worstEntryWithoutScope(): JournalEntry {
  const member = (i: number) => ({ kind: LONGEST_KIND, instance: `${i}`.padStart(MAX_INSTANCE_CHARS, "i") });
  const members = Array.from({ length: MEMBER_ROOM }, (_, i) => member(i));
  const now = 9_999_999_999.999; // a wall clock in seconds, with milliseconds: as long as it gets until the year 2286
  return {
    checkpoint_id: "c".repeat(MAX_CHECKPOINT_ID_CHARS),
    epoch: Number.MAX_SAFE_INTEGER,
    state: "restore_cleanup",
    participants: members,
    prepared_at: now,
    checkpoint_dir: `/${"d".repeat(MAX_CHECKPOINT_DIR_CHARS - 1)}`,
    scope: [],
    stop: false,
    restarts: [],
    auto_publish: false,
    controller_state: { file: COLLECTION_STATE_FILE, sha256: "0".repeat(64) },
    retire_at: members,
    incarnations: Object.fromEntries(members.map((m) => [`${m.kind}.${m.instance}`, "n".repeat(MAX_INCARNATION_CHARS)])),
    viewed: Object.fromEntries(members.map((m) => [`${m.kind}.${m.instance}`, "v".repeat(MAX_INCARNATION_CHARS)])),
    opened_epoch: Number.MAX_SAFE_INTEGER,
    opened_seq: Number.MAX_SAFE_INTEGER,
    updated_at: now,
  };
}

/** The most rows in flight whose scope fits, with rollout ids of at most `rolloutIdChars` characters. */
export function maxRowsInFlight(rolloutIdChars: number = MAX_ROLLOUT_ID_CHARS): number {
  const rest = Buffer.byteLength(JSON.stringify(worstEntryWithoutScope()));
  return Math.min(MAX_SCOPE, Math.floor((MAX_JOURNAL_ENTRY_BYTES - rest) / worstScopeEntryBytes(rolloutIdChars)));
}

/**
 * Refuses (`invalid_request`, nothing changed) a concurrency whose checkpoints could not carry
 * their scope. Rows in flight are also bounded by the row count, so a larger concurrency is fine
 * for a collection with no more rows than the ceiling.
 */
export function assertConcurrencyFits(concurrency: number, rows: readonly { rolloutId: string }[], flag = "--concurrency"): void {
  const longest = rows.reduce((most, row) => Math.max(most, row.rolloutId.length), 1);
  const ceiling = maxRowsInFlight(longest);
  if (concurrency <= ceiling || rows.length <= ceiling) return;
  throw new CheckpointError(
    "invalid_request",
    `${flag} ${concurrency} is over ${ceiling}, the most rows in flight whose checkpoint scope fits one control message with rollout ids of up to ${longest} characters (the longest in these rows): ` +
      `past it every checkpoint would be refused payload_too_large; ${maxRowsInFlight()} fit whatever the ids`,
  );
}
