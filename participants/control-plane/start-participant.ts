import type { NatsConnection } from "@nats-io/transport-node";
import { isAbsolute } from "node:path";
import type { Logger } from "pino";
import { DeploymentSchema, InstanceSchema, parseName, type CheckpointError, type RecordBase } from "../../protocol/index.js";
import { refuseCaseFoldingCheckpointRoot } from "../storage/case-folding-dir.js";
import type { CheckpointStorage } from "../storage/checkpoint-storage.js";
import type { Clock } from "./clock.js";
import { ParticipantControlPlane } from "./control-plane.js";
import { leaseIssued, readEpochFloor } from "./epoch-floor.js";
import { newIncarnation } from "./incarnation.js";
import { MembershipAnnouncer } from "./membership-announcer.js";
import { ControlEndpoint } from "./nats-endpoint.js";
import type { ParticipantKind } from "./participant-kind.js";

export interface StartParticipantOptions<R extends RecordBase> {
  nc: NatsConnection;
  deployment: string;
  instance: string;
  token: string;
  adapter: ParticipantKind<R>;
  storage?: CheckpointStorage;
  clock?: Clock;
  leaseGraceSeconds?: number;
  checkpointRoot?: string;
  logger?: Logger;
  /** Announce in the membership registry (default true). */
  announce?: boolean;
  /** Period of the membership heartbeat (default MEMBER_HEARTBEAT_MS); > 0 and at most a third of MEMBER_TTL_MS, else invalid_request. */
  heartbeatMs?: number;
}

export interface ParticipantHandle<R extends RecordBase> {
  controlPlane: ParticipantControlPlane<R>;
  /**
   * Settles with an `instance_conflict` error when another process took this kind/instance over
   * (this one was cut off from NATS long enough to be replaced). By then the participant has
   * stopped answering its control subjects; call `stop()` and end the process (the reference
   * servers exit 1). Pending forever otherwise, and without announcing (`announce: false`).
   */
  lost: Promise<CheckpointError>;
  /** Stops serving and removes its membership entry; calling it again returns the same promise. */
  stop(): Promise<void>;
}

/** Wires a kind adapter to its control plane, serves it on NATS and announces it. */
export async function startParticipant<R extends RecordBase>(options: StartParticipantOptions<R>): Promise<ParticipantHandle<R>> {
  parseName(DeploymentSchema, options.deployment, "a participant's deployment");
  parseName(InstanceSchema, options.instance, "a participant's instance");
  // The filesystem storage (the default) keeps one directory per checkpoint id and per instance: on a
  // root that folds case, ids differing only in case would share one. (A relative root is refused below.)
  if (options.checkpointRoot && isAbsolute(options.checkpointRoot) && !options.storage) await refuseCaseFoldingCheckpointRoot(options.checkpointRoot);
  // One incarnation for both: the control plane refuses what is not addressed to the one announced.
  const incarnation = newIncarnation();
  // Before it subscribes: no op is admitted below the epoch a leader already holds.
  const epochFloor = await readEpochFloor(options.nc, options.deployment, options.logger);
  const controlPlane = new ParticipantControlPlane<R>({
    adapter: options.adapter,
    instance: options.instance,
    incarnation,
    ...(options.storage && { storage: options.storage }),
    ...(options.clock && { clock: options.clock }),
    ...(options.leaseGraceSeconds !== undefined && { leaseGraceSeconds: options.leaseGraceSeconds }),
    ...(options.checkpointRoot && { checkpointRoot: options.checkpointRoot }),
    ...(options.logger && { logger: options.logger }),
    epochFloor,
    epochIssued: (epoch) => leaseIssued(options.nc, options.deployment, epoch, options.logger),
  });
  const endpoint = new ControlEndpoint(controlPlane as unknown as ParticipantControlPlane<RecordBase>, {
    nc: options.nc,
    deployment: options.deployment,
    token: options.token,
    ...(options.logger && { logger: options.logger }),
  });
  const announcer =
    options.announce === false
      ? undefined
      : new MembershipAnnouncer(options.nc, options.deployment, options.adapter.kind, options.instance, incarnation, options.logger, options.heartbeatMs);
  try {
    // Before subscribing: another process answering on these subjects is refused (instance_conflict).
    await announcer?.claim();
    endpoint.start();
    await options.nc.flush();
    await announcer?.start();
  } catch (error) {
    controlPlane.beginStopping();
    await endpoint.stop();
    controlPlane.dispose();
    throw error;
  }
  // Another incarnation owns the name now: every message for it is its. Unsubscribing is
  // synchronous (answers already being computed still finish); the owner decides what else stops.
  const lost = (announcer?.lost ?? new Promise<never>(() => undefined)).then((conflict) => {
    controlPlane.beginStopping();
    void endpoint.stop();
    return conflict;
  });
  let stopped: Promise<void> | undefined;
  return {
    controlPlane,
    lost,
    // Once: an owner may stop it from more than one shutdown path (a start-up's and a server's).
    stop() {
      stopped ??= (async () => {
        // First: the endpoint waits for answers being computed, and a prepare waiting for readiness would hold it until its deadline.
        controlPlane.beginStopping();
        await announcer?.stop();
        await endpoint.stop();
        controlPlane.dispose();
      })();
      return stopped;
    },
  };
}
