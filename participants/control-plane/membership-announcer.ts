import type { NatsConnection } from "@nats-io/transport-node";
import { Kvm, type KV } from "@nats-io/kv";
import type { Logger } from "pino";
import {
  MEMBER_HEARTBEAT_MS,
  MEMBER_TTL_MS,
  PROTOCOL_VERSION,
  memberKey,
  membersBucket,
  type Kind,
  type Member,
} from "../../protocol/index.js";

/**
 * Announces this participant in the deployment's membership registry and keeps the entry fresh.
 * The bucket's max_age (not per-key TTL, which nats-server 2.9 ignores) drops silent members.
 */
export class MembershipAnnouncer {
  private kv: KV | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly member: Member;

  constructor(
    private readonly nc: NatsConnection,
    private readonly deployment: string,
    kind: Kind,
    instance: string,
    /** The control plane's own incarnation: the coordinator addresses guarded messages to it. */
    incarnation: string,
    private readonly logger?: Logger,
    private readonly heartbeatMs = MEMBER_HEARTBEAT_MS,
  ) {
    const now = Date.now() / 1000;
    this.member = { kind, instance, incarnation, started_at: now, heartbeat_at: now, protocol_version: PROTOCOL_VERSION };
  }

  get key(): string {
    return memberKey(this.member.kind, this.member.instance);
  }

  async start(): Promise<void> {
    await this.beat();
    this.timer = setInterval(() => {
      this.beat().catch((error: unknown) => {
        // The bucket may be gone (deleted by an operator, or a NATS restart without its store):
        // the next beat creates it again instead of failing forever.
        this.kv = undefined;
        this.logger?.warn({ err: error }, "membership heartbeat failed");
      });
    }, this.heartbeatMs);
    this.timer.unref();
  }

  private async beat(): Promise<void> {
    this.kv ??= await new Kvm(this.nc).create(membersBucket(this.deployment), { history: 1, ttl: MEMBER_TTL_MS });
    this.member.heartbeat_at = Date.now() / 1000;
    await this.kv.put(this.key, JSON.stringify(this.member));
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.kv?.delete(this.key).catch(() => undefined);
  }
}
