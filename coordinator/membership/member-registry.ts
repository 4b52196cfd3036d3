import type { KV, KvEntry } from "@nats-io/kv";
import type { Logger } from "pino";
import { MemberSchema, PROTOCOL_VERSION, memberKey, participantOfMemberKey, protocolVersionMismatch, type Member } from "../../protocol/index.js";
import type { ParticipantRef } from "../engine/participant-client.js";
import { readsFromStreamLeader } from "./kv-bucket.js";
import { latestEntries } from "./kv-latest-entries.js";

/**
 * A membership entry this build cannot read (another protocol version's announcement, a corrupt
 * value): its KV key, the participant the key names (undefined for a key naming none) and why.
 * Never skipped silently: the participant behind it would be left out of every checkpoint.
 */
export interface UnreadableMember {
  key: string;
  participant: ParticipantRef | undefined;
  reason: string;
}

/** Where the engine learns the participants of a deployment. */
export interface MembershipSource {
  list(): Promise<ParticipantRef[]>;
  /** The live entries that name a participant this build cannot read (see UnreadableMember). */
  unreadable?(): Promise<UnreadableMember[]>;
  /** The member's current process incarnation, when this source knows it. */
  incarnationOf?(member: ParticipantRef): string | undefined;
  /**
   * Calls `listener` whenever the member's announced incarnation changes (a restarted process
   * announcing itself); returns the unsubscribe. Lets a request to the old process stop waiting.
   */
  onIncarnationChange?(member: ParticipantRef, listener: () => void): () => void;
  /**
   * False while this source's own view may be stale (its connection lost and the bucket not read
   * since): a member it does not list may be live. Absent: always current.
   */
  viewCurrent?(): boolean;
}

/**
 * The membership registry read from JetStream KV: one entry per live participant, refreshed by its
 * heartbeat and dropped by the bucket's max_age. An entry that does not read as this protocol
 * version's announcement is kept apart as unreadable (and logged), never skipped.
 *
 * Reads through the stream's leader, like the key snapshot they follow: a lagging replica of an R3
 * bucket answering a direct get would leave out a member that just joined (until the watch shows
 * its next heartbeat), and a checkpoint listed then would go ahead without it.
 */
export class KvMemberRegistry implements MembershipSource {
  private readonly kv: KV;

  constructor(
    kv: KV,
    private readonly logger?: Logger,
  ) {
    this.kv = readsFromStreamLeader(kv);
  }

  async members(): Promise<Member[]> {
    return (await this.aged()).map((m) => m.member);
  }

  /**
   * Every member with its entry's age in ms, measured on the NATS server's clock alone (the entries'
   * stored timestamps): up to the newest entry the bucket holds (a live member's heartbeat is at
   * most MEMBER_HEARTBEAT_MS old), or `nowMs` if that is earlier. Never more than the entry's true
   * age, whatever this host's clock says: a live member is never taken for an expired one.
   */
  async aged(nowMs = Date.now()): Promise<{ member: Member; ageMs: number; revision: number }[]> {
    return (await this.read(nowMs)).members;
  }

  /** As `aged`, with the unreadable entries (and their ages) beside the members; each with its entry's revision. */
  async read(
    nowMs = Date.now(),
  ): Promise<{ members: { member: Member; ageMs: number; revision: number }[]; unreadable: { unreadable: UnreadableMember; ageMs: number; revision: number }[] }> {
    const undecodable = (key: string, err: Error) => this.logger?.warn({ key, err }, "membership_entry_invalid");
    const entries = await latestEntries(this.kv, undecodable);
    const newest = Math.min(nowMs, entries.reduce((max, e) => Math.max(max, e.created.getTime()), 0));
    const members: { member: Member; ageMs: number; revision: number }[] = [];
    const unreadable: { unreadable: UnreadableMember; ageMs: number; revision: number }[] = [];
    for (const entry of entries) {
      const read = readEntry(entry, this.logger);
      const ageMs = Math.max(0, newest - entry.created.getTime());
      const revision = entry.revision;
      if (read && "member" in read) members.push({ member: read.member, ageMs, revision });
      else if (read) unreadable.push({ unreadable: read.unreadable, ageMs, revision });
    }
    members.sort((a, b) => (a.member.kind + "." + a.member.instance < b.member.kind + "." + b.member.instance ? -1 : 1));
    unreadable.sort((a, b) => (a.unreadable.key < b.unreadable.key ? -1 : 1));
    return { members, unreadable };
  }

  async list(): Promise<ParticipantRef[]> {
    return (await this.members()).map((m) => ({ kind: m.kind, instance: m.instance }));
  }

  async unreadable(): Promise<UnreadableMember[]> {
    return (await this.read()).unreadable.map((u) => u.unreadable);
  }
}

/**
 * What a registry entry holds: this protocol version's member, or (logged) an unreadable one: a
 * value naming another `protocol_version`, or one that is no announcement of this version (corrupt,
 * or with fields this version lacks). Undefined for a delete marker, or an entry whose operation
 * cannot be decoded (see operationOf).
 */
export function readEntry(entry: KvEntry, logger: Logger | undefined): { member: Member } | { unreadable: UnreadableMember } | undefined {
  if (operationOf(entry, logger) !== "PUT") return undefined;
  let value: unknown;
  let json = true;
  try {
    value = entry.json();
  } catch {
    json = false;
  }
  const parsed = json ? MemberSchema.safeParse(value) : undefined;
  const mismatch = protocolVersionMismatch(value, `membership entry ${entry.key}`);
  // An announcement under another participant's key (copied by hand, a tool writing the wrong key)
  // would list its participant twice and leave the key's own participant out of every checkpoint.
  const misplaced = parsed?.success && memberKey(parsed.data.kind, parsed.data.instance) !== entry.key;
  if (mismatch === undefined && parsed?.success && !misplaced) return { member: parsed.data };
  const why =
    mismatch ??
    (misplaced
      ? `membership entry ${entry.key} announces ${parsed.data!.kind}/${parsed.data!.instance}, another participant than its key names`
      : `membership entry ${entry.key} is not a protocol version ${PROTOCOL_VERSION} announcement (${parsed ? issueOf(parsed.error!) : "not JSON"})`);
  logger?.warn({ key: entry.key, reason: why }, "membership_entry_invalid");
  return { unreadable: { key: entry.key, participant: participantOfMemberKey(entry.key), reason: why } };
}

/** The first thing zod found wrong, short: `instance: Required`, `unknown key "gpus"`. */
function issueOf(error: { issues: { path: PropertyKey[]; message: string }[] }): string {
  const issue = error.issues[0];
  if (!issue) return "invalid";
  const path = issue.path.map(String).join(".");
  return (path ? `${path}: ${issue.message}` : issue.message).slice(0, 200);
}

/**
 * The entry's operation; undefined (logged) when nats.js cannot decode the message's header block
 * (any client allowed to publish on the bucket can store one): it decodes them lazily, and throws.
 */
export function operationOf(entry: KvEntry, logger: Logger | undefined): KvEntry["operation"] | undefined {
  try {
    return entry.operation;
  } catch (error) {
    logger?.warn({ key: entry.key, err: error }, "membership_entry_invalid");
    return undefined;
  }
}
