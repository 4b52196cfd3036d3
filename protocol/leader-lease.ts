import { PROTOCOL_VERSION } from "./version.js";

/**
 * The leader lease's key in the leader bucket (`leaderBucket`) and the value the coordinator
 * writes there: read by controller clients (who leads, in which term) and by participants (the
 * epoch floor a restarted process starts from). The coordinator's `LeaderLease` writes it.
 */
export const LEADER_KEY = "coordinator";

/**
 * The shortest lease period (`lease_ms`) a coordinator accepts. A term serves only once it has
 * waited a whole one after winning the key, which controller clients rely on (they let one lease
 * read stand for the ops of the next half of it).
 */
export const MIN_LEASE_MS = 200;

/**
 * The key's value. `epoch` is the term's epoch, the revision its create returned: null in the create
 * itself (the revision is not known before it), named by every renewal after it. `at` is wall time
 * for humans, never compared. `protocol_version` is the writer's (PROTOCOL_VERSION): the bucket is
 * the deployment's whatever the version, so a coordinator of another version can hold it while this
 * version's controllers find nobody serving their subjects. Values written before `term`, `serving`,
 * `epoch` and `protocol_version` lack them.
 */
export interface LeaseValue {
  id: string;
  term: string;
  serving: boolean;
  epoch: number | null;
  at: number;
}

export function encodeLeaseValue(value: LeaseValue): string {
  return JSON.stringify({ id: value.id, term: value.term, serving: value.serving, epoch: value.epoch, at: value.at, protocol_version: PROTOCOL_VERSION });
}

/** What a reader can rely on in a value (an older coordinator's lacks term, serving, epoch and protocol_version: undefined). */
export interface LeaseHolder {
  id: string;
  term: string | undefined;
  serving: boolean | undefined;
  /** The term's epoch; null in its create (the entry's revision is the epoch); undefined when not named. */
  epoch: number | null | undefined;
  /** The protocol version its coordinator speaks; undefined when not named (a v1 coordinator older than the field). */
  protocolVersion: number | undefined;
}

/** The holder a value names, undefined for a value that does not parse or names no id. */
export function decodeLeaseValue(text: string): LeaseHolder | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof parsed !== "object" || parsed === null) return undefined;
  const { id, term, serving, epoch, protocol_version } = parsed as { id?: unknown; term?: unknown; serving?: unknown; epoch?: unknown; protocol_version?: unknown };
  if (typeof id !== "string") return undefined;
  return {
    id,
    term: typeof term === "string" ? term : undefined,
    serving: typeof serving === "boolean" ? serving : undefined,
    epoch: epoch === null ? null : Number.isSafeInteger(epoch) && (epoch as number) > 0 ? (epoch as number) : undefined,
    protocolVersion: Number.isSafeInteger(protocol_version) ? (protocol_version as number) : undefined,
  };
}

/**
 * Why this version's controllers find no coordinator serving while `holder` leads, when it speaks
 * another protocol version (its controller API is on that version's subjects); undefined when it
 * speaks this one or names none (a v1 coordinator older than the field).
 */
export function leaderOfOtherVersion(holder: LeaseHolder | null | undefined): string | undefined {
  if (!holder || holder.protocolVersion === undefined || holder.protocolVersion === PROTOCOL_VERSION) return undefined;
  const side = holder.protocolVersion > PROTOCOL_VERSION ? "a newer" : "an older";
  return `the leader lease is held by coordinator ${holder.id}, which speaks protocol version ${holder.protocolVersion} (${side} gym-ckpt); this one speaks protocol version ${PROTOCOL_VERSION}: no coordinator of this version leads while it does. Run the deployment's coordinators at one protocol version`;
}

/**
 * The lowest epoch a leader that may still act can hold, from the bucket's state read first
 * (`lastSeq`, the stream's last sequence) and the key read after it (`held`: its revision and value,
 * or null when nobody leads). Every deposed leader's epoch is below it, so a participant starting
 * up fences them without having seen the epoch that deposed them:
 * - the key names its term's epoch: that one (every earlier term's is lower);
 * - the key is its term's create (epoch null): the sequence before it (its revision - 1), as if read
 *   just before the create. Not the revision: that campaign's epoch floor probes the participants
 *   after its create, and one started since would report that very revision, so the campaign would
 *   take it for an epoch in use and purge and create its key again. Within one bucket nothing that
 *   acted is let in: a term whose create was the sequence before never renewed. After a campaign
 *   moved past a recreated bucket's floor, the sequence before is that floor (as the last sequence
 *   reads between its purge and its create): the new leader's recovery probe raises the fence;
 * - nobody leads: the last sequence, which every past term's epoch lies below once it served (a
 *   term renews, so moves the sequence past its epoch, before its first lease period ends and it
 *   acts), and the next term's create lies past;
 * - a value naming no epoch (an older coordinator's) or that does not parse: 0, no floor.
 */
export function leaseEpochFloor(lastSeq: number, held: { revision: number; value: string } | null): number {
  if (held === null) return Number.isSafeInteger(lastSeq) && lastSeq > 0 ? lastSeq : 0;
  const epoch = decodeLeaseValue(held.value)?.epoch;
  if (epoch === null) return Math.max(0, held.revision - 1);
  return epoch ?? 0;
}

/**
 * The highest epoch the lease has issued, from the same reads as leaseEpochFloor: every term's
 * epoch is the revision of its create, so none is above the epoch the key names now (its create's
 * revision while it names none yet) or, when nobody leads, above the last sequence. An epoch above
 * it was never any coordinator's (a forged or corrupted message). Undefined when the value names
 * no epoch (an older coordinator's, or one that does not parse): it cannot be told.
 */
export function leaseIssuedEpoch(lastSeq: number, held: { revision: number; value: string } | null): number | undefined {
  if (held === null) return Number.isSafeInteger(lastSeq) && lastSeq > 0 ? lastSeq : 0;
  const epoch = decodeLeaseValue(held.value)?.epoch;
  return epoch === null ? held.revision : epoch;
}

/**
 * An epoch a later lease revision can still pass: below 2^53 - 1 (a hand-edited checkpoint.json or
 * journal entry may carry more). One that is not would, as an epoch floor, keep every leader below it.
 */
export function isPassableEpoch(epoch: number): boolean {
  return Number.isSafeInteger(epoch + 1);
}
