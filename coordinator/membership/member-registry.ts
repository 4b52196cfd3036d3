import type { KV, KvEntry } from "@nats-io/kv";
import type { Logger } from "pino";
import { MemberSchema, type Member } from "../../protocol/index.js";
import type { ParticipantRef } from "../engine/participant-client.js";
import { readsFromStreamLeader } from "./kv-bucket.js";
import { latestEntries } from "./kv-latest-entries.js";

/** Where the engine learns the participants of a deployment. */
export interface MembershipSource {
  list(): Promise<ParticipantRef[]>;
  /** The member's current process incarnation, when this source knows it. */
  incarnationOf?(member: ParticipantRef): string | undefined;
  /**
   * Calls `listener` whenever the member's announced incarnation changes (a restarted process
   * announcing itself); returns the unsubscribe. Lets a request to the old process stop waiting.
   */
  onIncarnationChange?(member: ParticipantRef, listener: () => void): () => void;
}

/**
 * The membership registry read from JetStream KV: one entry per live participant, refreshed by its
 * heartbeat and dropped by the bucket's max_age. Malformed entries are skipped and logged.
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
  async aged(nowMs = Date.now()): Promise<{ member: Member; ageMs: number }[]> {
    const unreadable = (key: string, err: Error) => this.logger?.warn({ key, err }, "membership_entry_invalid");
    const entries = await latestEntries(this.kv, unreadable);
    const newest = Math.min(nowMs, entries.reduce((max, e) => Math.max(max, e.created.getTime()), 0));
    const members: { member: Member; ageMs: number }[] = [];
    for (const entry of entries) {
      const member = memberOf(entry, this.logger);
      if (member) members.push({ member, ageMs: Math.max(0, newest - entry.created.getTime()) });
    }
    return members.sort((a, b) => (a.member.kind + "." + a.member.instance < b.member.kind + "." + b.member.instance ? -1 : 1));
  }

  async list(): Promise<ParticipantRef[]> {
    return (await this.members()).map((m) => ({ kind: m.kind, instance: m.instance }));
  }
}

/** The member a registry entry holds; undefined for a delete marker or (logged) a malformed value. */
export function memberOf(entry: KvEntry, logger: Logger | undefined): Member | undefined {
  if (operationOf(entry, logger) !== "PUT") return undefined;
  let value: unknown;
  try {
    value = entry.json();
  } catch {
    value = undefined;
  }
  const parsed = MemberSchema.safeParse(value);
  if (!parsed.success) logger?.warn({ key: entry.key }, "membership_entry_invalid");
  return parsed.success ? parsed.data : undefined;
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
