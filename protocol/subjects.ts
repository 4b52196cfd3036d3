import { parseName } from "./codec.js";
import { DeploymentSchema, InstanceSchema } from "./ids.js";
import { KindSchema, type Kind } from "./kinds.js";
import type { Op } from "./messages.js";
import { PROTOCOL_VERSION } from "./version.js";

/**
 * Every NATS subject and KV bucket name gym-ckpt uses, in one place.
 *   gym.ckpt.v<PROTOCOL_VERSION>.<deployment>.p.<kind>.<instance>.<op>   one participant's control op (request/reply)
 *   gym.ckpt.v<PROTOCOL_VERSION>.<deployment>.ctl.<op>                    the controller API of the active coordinator
 * Directed subjects per participant make every outcome attributable.
 */
const ROOT = `gym.ckpt.v${PROTOCOL_VERSION}`; // from the version, so a bump cannot leave the subjects behind

/** Deployment names deploymentToken accepted already (a process uses one or two). */
const checkedDeployments = new Set<string>();

/**
 * The deployment as it goes into a subject or a bucket name: one subject token, else
 * `invalid_request`. Checked here, where every subject and bucket is named, so no library caller
 * can pass `*` (a controller API subscribing `gym.ckpt.v1.*.ctl.<op>` would answer, and run, every
 * deployment's controller requests) or a dotted name reaching into another deployment's subjects
 * (`a.p.environment`'s controller subjects are deployment `a`'s participant `environment/ctl`).
 */
function deploymentToken(deployment: string): string {
  // Every request names its subject: a name checked once is not parsed again.
  if (checkedDeployments.has(deployment)) return deployment;
  parseName(DeploymentSchema, deployment, "deployment");
  if (checkedDeployments.size < 64) checkedDeployments.add(deployment);
  return deployment;
}

export function participantSubject(deployment: string, kind: Kind, instance: string, op: Op): string {
  return `${ROOT}.${deploymentToken(deployment)}.p.${kind}.${instance}.${op}`;
}

export function controllerSubject(deployment: string, op: string): string {
  return `${ROOT}.${deploymentToken(deployment)}.ctl.${op}`;
}

/** KV buckets; nats-server 2.9 applies TTL per bucket only, so each lifetime gets its own bucket. */
export function membersBucket(deployment: string): string {
  return `gym_ckpt_${deploymentToken(deployment)}_members`;
}
export function leaderBucket(deployment: string): string {
  return `gym_ckpt_${deploymentToken(deployment)}_leader`;
}
export function journalBucket(deployment: string): string {
  return `gym_ckpt_${deploymentToken(deployment)}_journal`;
}

export function memberKey(kind: Kind, instance: string): string {
  return `${kind}.${instance}`;
}

/** The participant a membership key names (memberKey's inverse); undefined for a key naming no kind and instance. */
export function participantOfMemberKey(key: string): { kind: Kind; instance: string } | undefined {
  const dot = key.indexOf(".");
  const kind = KindSchema.safeParse(key.slice(0, dot));
  const instance = InstanceSchema.safeParse(key.slice(dot + 1));
  return dot > 0 && kind.success && instance.success ? { kind: kind.data, instance: instance.data } : undefined;
}

/** Headers on control messages. */
export const HEADER_AUTHORIZATION = "Authorization";
export const HEADER_TRACEPARENT = "traceparent";
export const HEADER_TRACESTATE = "tracestate";

/**
 * Membership registry lifetime. Participants re-put their entry every MEMBER_HEARTBEAT_MS; the
 * bucket's max_age (MEMBER_TTL_MS) drops the entry of a participant that stopped.
 */
export const MEMBER_TTL_MS = 15_000;
export const MEMBER_HEARTBEAT_MS = 5_000;
