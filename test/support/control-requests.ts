import { headers, type NatsConnection } from "@nats-io/transport-node";
import { isNoResponders, participantSubject, type Kind, type Op } from "../../protocol/index.js";

/**
 * Control requests sent straight to one participant over NATS, as a coordinator would (bearer
 * token in the header); the reply body is returned as parsed JSON, refusals included.
 */
export async function controlRequest(
  nc: NatsConnection,
  target: { deployment: string; kind: Kind; instance: string; token: string | null },
  op: Op,
  body: unknown,
  timeoutMs = 10_000,
): Promise<any> {
  const h = headers();
  if (target.token !== null) h.set("Authorization", `Bearer ${target.token}`);
  const payload = typeof body === "string" ? body : JSON.stringify(body);
  const msg = await nc.request(participantSubject(target.deployment, target.kind, target.instance, op), payload, { timeout: timeoutMs, headers: h });
  return msg.json();
}

/** The common phase-message fields: checkpoint id, a deadline `seconds` from now, epoch 1. */
export const phase = (id: string, extra: object = {}, seconds = 30) => ({ checkpoint_id: id, deadline_ts: Date.now() / 1000 + seconds, epoch: 1, ...extra });

/** Whether nothing is subscribed to a participant name's status subject any more (NATS no-responders). */
export function nobodyAnswers(nc: NatsConnection, deployment: string, kind: Kind, instance: string): Promise<boolean> {
  return nc.request(participantSubject(deployment, kind, instance, "status"), "", { timeout: 2_000 }).then(
    () => false,
    (error: unknown) => isNoResponders(error),
  );
}
