import type { KV, KvEntry } from "@nats-io/kv";
import type { Logger } from "pino";
import { MEMBER_TTL_MS, memberKey, type Member } from "../../protocol/index.js";
import { systemClock, type Clock } from "../engine/clock.js";
import type { ParticipantRef } from "../engine/participant-client.js";
import { KvMemberRegistry, memberOf, type MembershipSource } from "./member-registry.js";

interface Cached {
  member: Member;
  /**
   * When this entry was last written as this process saw it (its receipt, or the seed's read), on
   * the monotonic clock: a wall-clock step (NTP, a VM resume) must neither drop live members from
   * the next checkpoint nor keep a silent one in it.
   */
  seenAt: number;
}

/**
 * The membership registry kept in memory from a KV watch, so listing members costs nothing on the
 * checkpoint path. nats-server 2.9 sends no notification when max_age drops an entry, so an entry
 * not refreshed within MEMBER_TTL_MS is treated as gone, exactly as the bucket would drop it.
 */
export class WatchedMemberRegistry implements MembershipSource {
  private readonly cache = new Map<string, Cached>();
  private stopWatch: (() => void) | undefined;

  constructor(
    private readonly kv: KV,
    private readonly logger?: Logger,
    private readonly clock: Clock = systemClock,
    private readonly ttlMs = MEMBER_TTL_MS,
  ) {}

  async start(): Promise<void> {
    const watch = await this.kv.watch({ include: "updates" });
    this.stopWatch = () => watch.stop();
    void (async () => {
      for await (const entry of watch) this.apply(entry, this.clock.monotonic());
    })().catch((error: unknown) => this.logger?.error({ err: error }, "membership_watch_failed"));
    // Seed after the watch is running so nothing written meanwhile is missed.
    const seeded = await new KvMemberRegistry(this.kv, this.logger).members();
    const now = this.clock.monotonic();
    for (const member of seeded) {
      const key = memberKey(member.kind, member.instance);
      if (!this.cache.has(key)) this.cache.set(key, { member, seenAt: now });
    }
  }

  private apply(entry: KvEntry, now: number): void {
    if (entry.operation !== "PUT") {
      this.cache.delete(entry.key);
      return;
    }
    const member = memberOf(entry, this.logger);
    if (member) this.cache.set(entry.key, { member, seenAt: now });
  }

  members(): Member[] {
    const cutoff = this.clock.monotonic() - this.ttlMs;
    const live: Member[] = [];
    for (const [key, cached] of this.cache) {
      if (cached.seenAt < cutoff) this.cache.delete(key);
      else live.push(cached.member);
    }
    return live.sort((a, b) => (memberKey(a.kind, a.instance) < memberKey(b.kind, b.instance) ? -1 : 1));
  }

  async list(): Promise<ParticipantRef[]> {
    return this.members().map((m) => ({ kind: m.kind, instance: m.instance }));
  }

  incarnationOf(member: ParticipantRef): string | undefined {
    return this.cache.get(memberKey(member.kind, member.instance))?.member.incarnation;
  }

  stop(): void {
    this.stopWatch?.();
  }
}
