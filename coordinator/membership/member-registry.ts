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
    const members: Member[] = [];
    const unreadable = (key: string, err: Error) => this.logger?.warn({ key, err }, "membership_entry_invalid");
    for (const entry of await latestEntries(this.kv, unreadable)) {
      const member = memberOf(entry, this.logger);
      if (member) members.push(member);
    }
    return members.sort((a, b) => (a.kind + "." + a.instance < b.kind + "." + b.instance ? -1 : 1));
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
