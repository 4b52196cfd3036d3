import { randomBytes } from "node:crypto";
import { mkdir, rmdir } from "node:fs/promises";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { HttpControllerApi } from "../api/http-api.js";
import { NatsControllerApi } from "../api/nats-api.js";
import { expectedRefs, type CoordinatorConfig } from "../config/coordinator-config.js";
import { CheckpointEngine, type EngineHooks } from "../engine/checkpoint-engine.js";
import { systemClock, type Clock } from "../engine/clock.js";
import { NatsParticipantTransport } from "../engine/nats-transport.js";
import { ParticipantClient } from "../engine/participant-client.js";
import { KvDecisionJournal } from "../ha/decision-journal.js";
import { LeaderLease } from "../ha/leader-lease.js";
import { WatchedMemberRegistry } from "../membership/watched-member-registry.js";
import { openMembersBucket } from "../membership/members-bucket.js";
import { CheckpointCatalog } from "../publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../publication/global-manifest-writer.js";
import { fsyncDirectory } from "../publication/durable-fs.js";
import { TRASH_PREFIX } from "../publication/retention.js";
import { assertRootClaimed, claimRootForDeployment } from "../publication/root-deployment.js";
import { refuseCaseFoldingRoot } from "../publication/case-folding-root.js";
import { createLogger } from "../telemetry/logger.js";
import { CheckpointError, DeploymentSchema, connectNatsWithin, equalJitter, finishedWithin, isMisplacedDirectory, kvReplicas, makeDirectories, MEMBER_HEARTBEAT_MS, MEMBER_TTL_MS, NATS_INBOX_PREFIXES, parentsOfCreated, NATS_OP_REPLY_PREFIX, NATS_PING_OPTIONS, natsServers, PACKAGE_VERSION, PROTOCOL_VERSION, parseName, ROOT_DEPLOYMENT_FILE, within } from "../../protocol/index.js";
import { newCoordinatorId } from "./coordinator-id.js";
import { logNatsStatus } from "../../protocol/nats-status-log.js";
import { highestEpochInUse } from "./epoch-floor.js";

/** The longest a winning campaign waits for participants' statuses (see `epochFloor`). */
const STATUS_PROBE_MS = 2_000;

/** Test-only fault injection and observation: the engine's points, and the daemon's own. Unset, each costs one optional call. */
export interface CoordinatorHooks extends EngineHooks {
  /** Test-only. Called when the lease announces a term ready, before anything else (a stopping coordinator's included). */
  onLeaseReady?: (epoch: number) => void;
  /**
   * Test-only. Awaited before each `engine.recover()` of a term (attempt 1, 2, …); a throw fails
   * that attempt as a failed recovery would (logged, retried after a pause).
   */
  beforeRecover?: (epoch: number, attempt: number) => void | Promise<void>;
  /** Test-only. Reports the pause chosen before the retry of failed recovery attempt `attempt`. */
  onRecoveryRetryPause?: (pauseMs: number, attempt: number) => void;
  /**
   * Test-only. Awaited by `stop()` together with the controller APIs' stop (so within
   * `stop_grace_ms`, before the lease stops), as answers still in flight would hold it.
   */
  whileStoppingApis?: () => Promise<void>;
  /**
   * Test-only. Awaited once a term recovered, before its NATS controller API starts (so before the lease is
   * marked serving): the HTTP API already serves ops meanwhile. Lets a test hold that gap open.
   */
  beforeNatsApiStart?: (epoch: number) => void | Promise<void>;
}

export interface StartCoordinatorOptions {
  config: CoordinatorConfig;
  logger?: Logger;
  clock?: Clock;
  /** Use this connection instead of connecting (it is not closed on stop). */
  nc?: NatsConnection;
  /** Test-only fault injection. */
  hooks?: CoordinatorHooks;
  /** Test-only: how long a removed journal entry's purge marker stays (KvDecisionJournal.open's `markerKeepMs`; 30 min). */
  journalMarkerKeepMs?: number;
  /** Called just before the leader lease starts campaigning: from then on this process may hold the leader key, which only `stop()` releases before it expires. */
  beforeCampaign?: () => void;
}

export interface CoordinatorHandle {
  id: string;
  engine: CheckpointEngine;
  lease: LeaderLease;
  /** The membership registry as this coordinator sees it (kept from a KV watch). */
  members: WatchedMemberRegistry;
  natsApi: NatsControllerApi;
  httpUrl: string | undefined;
  /** Settles when the NATS connection closed for good (the CLI treats that as fatal). */
  closed: Promise<void | Error>;
  /** Resolves once this coordinator is the ready leader and has finished recovery. */
  whenReady(): Promise<void>;
  /** `reason` (a signal name, `nats_connection_closed`) goes on the `coordinator_stopped` line. */
  stop(reason?: string): Promise<void>;
}

/**
 * Wires one coordinator: NATS connection, membership registry (bucket config asserted), decision
 * journal, leader lease, engine, NATS and HTTP controller APIs. The NATS controller API is served
 * only while this coordinator is the ready leader, after it recovered what a predecessor journaled.
 */
export async function startCoordinator(options: StartCoordinatorOptions): Promise<CoordinatorHandle> {
  const { config } = options;
  // A config that did not come through CoordinatorConfigSchema (a library caller): its deployment names the root's owner below.
  parseName(DeploymentSchema, config.deployment, "deployment");
  const clock = options.clock ?? systemClock;
  const id = config.coordinator_id ?? newCoordinatorId();
  const logger = (options.logger ?? createLogger(config.log_level)).child({ component: "coordinator", coordinator_id: id, deployment: config.deployment });
  // Before NATS: a root that cannot be used, or a GYM_CKPT_NATS_REPLICAS out of range (checked here
  // only, its count is taken once connected), is configuration (exit 2), which an unreachable NATS
  // (exit 1, restarted) must not hide until NATS comes back.
  kvReplicas(undefined);
  // Before the root is made: an empty mount point (storage not mounted yet) must not be claimed.
  if (config.require_existing_root_claim) await assertRootClaimed(config.checkpoint_root);
  const created = await makeDirectories(config.checkpoint_root).catch((error: NodeJS.ErrnoException) => {
    // A root that cannot exist there is configuration (exit 2: restarting will not help); EIO and the like are not.
    if (!isMisplacedDirectory(error)) throw error;
    throw new CheckpointError("invalid_request", `checkpoint_root ${config.checkpoint_root} cannot be created (${error.message})`, { cause: error });
  });
  // A new directory's entry is in its parent: unsynced, a power loss could take the root with every
  // checkpoint published into it (their own fsyncs stop at the root).
  for (const parent of parentsOfCreated(config.checkpoint_root, created)) await fsyncDirectory(parent);
  await assertWritableRoot(config.checkpoint_root);
  // Ids differing only in case must not share a checkpoint directory.
  await refuseCaseFoldingRoot(config.checkpoint_root);
  // Before anything of this deployment touches the root: another deployment's checkpoints there would be deleted by our retention.
  await claimRootForDeployment(config.checkpoint_root, config.deployment);
  const ownsConnection = options.nc === undefined;
  const nc =
    options.nc ??
    (await connectNatsWithin({
      servers: natsServers(config.nats.servers),
      name: `gym-ckpt-coordinator-${id}`,
      timeout: config.nats.connect_timeout_ms,
      inboxPrefix: NATS_INBOX_PREFIXES.coordinator,
      maxReconnectAttempts: -1,
      reconnectTimeWait: 500,
      ...NATS_PING_OPTIONS,
      // One Error (with a captured stack) per request otherwise: measurable at hundreds of participants.
      noAsyncTraces: true,
      ...(config.nats.user !== undefined && { user: config.nats.user }),
      ...(config.nats.pass !== undefined && { pass: config.nats.pass }),
      ...(config.nats.token !== undefined && { token: config.nats.token }),
    }, config.nats.connect_wait_ms, { unreachable: "not_leader", consequence: "this coordinator cannot start until NATS is reachable (a supervisor restarts it)" }, logger));
  let stopped = false;
  void logNatsStatus(nc.status(), logger, () => stopped);
  const catalog = new CheckpointCatalog(config.checkpoint_root, ROOT_DEPLOYMENT_FILE);
  let registry: WatchedMemberRegistry | undefined;
  let journal: KvDecisionJournal;
  try {
    const membersKv = await openMembersBucket(nc, config.deployment);
    // Asserted again whenever the registry reads the bucket afresh (a reconnect, a re-created bucket).
    registry = new WatchedMemberRegistry(membersKv, logger, clock, MEMBER_TTL_MS, MEMBER_HEARTBEAT_MS, () => openMembersBucket(nc, config.deployment));
    await registry.start();
    // A restore's outcome record stays while its checkpoint does (the root must be held to tell).
    journal = await KvDecisionJournal.open(nc, config.deployment, logger, options.journalMarkerKeepMs, (id) => {
      catalog.assertRootHeld();
      return catalog.has(id);
    });
  } catch (error) {
    // A connection left open would keep the process alive after the refusal is printed.
    registry?.stop();
    if (ownsConnection) await nc.close().catch(() => undefined);
    throw error;
  }
  let natsApi!: NatsControllerApi;
  let readyResolve!: () => void;
  const ready = new Promise<void>((resolve) => (readyResolve = resolve));

  const lease = new LeaderLease({
    nc,
    deployment: config.deployment,
    id,
    leaseMs: config.lease_ms,
    clock,
    logger,
    // Participants' epochs and the journal's asked within a quarter lease, so the campaign ends well
    // before the key it just created needs renewing.
    // (Typed: the engine, built below, refers to this lease.)
    epochFloor: (): Promise<number> => {
      const withinMs = Math.min(STATUS_PROBE_MS, config.lease_ms / 4);
      return highestEpochInUse(
        { published: () => catalog.highestEpoch((checkpoint_id, epoch) => logger.error({ checkpoint_id, highest_published_epoch: epoch }, "published_epoch_out_of_range_ignored")), seen: (): Promise<number> => engine.highestEpochSeen(withinMs), journaled: () => within(journal.highestEpoch(), withinMs, (fn, ms) => clock.setTimer(fn, ms)) },
        logger,
      );
    },
    onReady: async (epoch) => {
      options.hooks?.onLeaseReady?.(epoch);
      // A stop sets `stopped` and closes the controller APIs (waiting for the answers in flight)
      // before it stops the lease: a lease ready meanwhile must not start a recovery (status probes
      // carrying its epoch, re-driven decisions) in a coordinator already stopping.
      if (stopped) return;
      // Controller ops wait for recovery: retried (backing off to 5 s) while this term lasts.
      for (let attempt = 1; ; attempt++) {
        try {
          await options.hooks?.beforeRecover?.(epoch, attempt);
          const recovered = await engine.recover();
          if (recovered.length) logger.info({ recovered }, "recovery_done");
          break;
        } catch (error) {
          logger.error({ err: error, attempt }, "recovery_failed");
          // Jittered (the clock's random source): coordinators failing in one outage do not retry in step.
          const pauseMs = equalJitter(Math.min(5000, 250 * 2 ** attempt), clock.random);
          options.hooks?.onRecoveryRetryPause?.(pauseMs, attempt);
          await new Promise((resolve) => setTimeout(resolve, pauseMs).unref());
          const state = lease.state();
          if (stopped || !state.leader || state.epoch !== epoch) return;
        }
      }
      await options.hooks?.beforeNatsApiStart?.(epoch);
      // Lost during a recovery that completed (onLost found nothing to stop yet): subscribed now, it
      // would take every controller request and answer none (not answering), so a controller no
      // longer sees no-responders while no coordinator serves. The next term starts it.
      const state = lease.state();
      if (stopped || !state.leader || state.epoch !== epoch) return;
      await natsApi.start();
      // Stopped while subscribing: the stop unsubscribed them; the key must not say this term serves.
      if (stopped) return;
      // Only now does the lease say this term serves (controllers waiting on a request read it).
      await lease.markServing(epoch).catch((error: unknown) => logger.error({ err: error }, "lease_mark_serving_failed"));
      readyResolve();
    },
    onLost: () => {
      void natsApi.stop();
      engine.leadershipLost();
    },
  });
  const writer = new GlobalManifestWriter(catalog, config.retention, (err) => logger.warn({ err }, "retention_cleanup_failed"));
  const engine = new CheckpointEngine({
    deployment: config.deployment,
    client: new ParticipantClient({
      // Participants answer under their own reply prefix, never into the coordinator's inbox.
      transport: new NatsParticipantTransport(nc, NATS_OP_REPLY_PREFIX),
      deployment: config.deployment,
      token: config.token,
      clock,
      slackMs: config.request_slack_ms,
      attemptTimeoutMs: config.request_attempt_ms,
      presenceProbeMs: config.request_probe_ms,
    }),
    membership: registry,
    leadership: lease,
    journal,
    catalog,
    writer,
    clock,
    logger,
    defaultTimeoutMs: config.default_timeout_ms,
    requireRecovery: true,
    ...(config.expected_participants && { expected: expectedRefs(config.expected_participants) }),
    ...(options.hooks && { hooks: options.hooks }),
  });
  const controllerToken = config.controller_token ?? config.token;
  natsApi = new NatsControllerApi({ nc, deployment: config.deployment, token: controllerToken, engine, answering: () => lease.state().ready, logger });
  let http: HttpControllerApi | undefined;
  try {
    if (config.http.enabled) {
      http = new HttpControllerApi({ engine, leadership: lease, token: controllerToken, host: config.http.host, port: config.http.port, logger });
      await http.start();
    }
    options.beforeCampaign?.();
    await lease.start();
  } catch (error) {
    await http?.stop().catch(() => undefined);
    registry.stop();
    if (ownsConnection) await nc.close().catch(() => undefined);
    throw error;
  }
  // Which build, on which server and address: the first things asked of a log at 3 a.m. (the
  // server as connected, host:port, never the configured URL and its credentials).
  logger.info(
    { version: PACKAGE_VERSION, protocol_version: PROTOCOL_VERSION, nats: nc.getServer(), http: http?.url, lease_ms: config.lease_ms, checkpoint_root: config.checkpoint_root },
    "coordinator_started",
  );
  return {
    id,
    engine,
    lease,
    members: registry,
    natsApi,
    httpUrl: http?.url,
    closed: nc.closed(),
    whenReady: () => ready,
    async stop(reason = "stop requested") {
      stopped = true;
      // Both APIs stop taking requests at once, then the ops under way on either are answered:
      // one after the other, the HTTP API ran every op sent to it while the NATS API's were awaited.
      // Within stop_grace_ms: a prepare held by a blocker would run to its deadline, past the
      // supervisor's SIGKILL. Past it this stops as after a crash: a successor (one lease period
      // later, and fenced by its epoch) completes a decided commit or aborts the rest.
      const answered = await finishedWithin(Promise.all([natsApi.stop(), http?.stop(), options.hooks?.whileStoppingApis?.()]), config.stop_grace_ms, (fn, ms) => clock.setTimer(fn, ms));
      if (!answered) logger.warn({ stop_grace_ms: config.stop_grace_ms }, "coordinator_stop_ops_unanswered");
      await lease.stop(true);
      registry.stop();
      await writer.settled();
      // A drain needs the server: with NATS gone (often why we stop) it fails, and the connection
      // would go on reconnecting for ever and keep the process alive. Close it then.
      if (ownsConnection) await nc.drain().catch(() => nc.close().catch(() => undefined));
      logger.info({ reason }, "coordinator_stopped");
    },
  };
}

/**
 * An existing root this process cannot write (another user's 0555 directory, a read-only mount)
 * would otherwise be served as ready and fail every checkpoint's mkdir with internal_error. Probed
 * by doing what a checkpoint does, creating a directory there, rather than access(2), which root
 * passes regardless of mode bits and NFS may answer from cached attributes. The probe is named like
 * trash, so retention sweeps it if this process dies before removing it.
 */
async function assertWritableRoot(root: string): Promise<void> {
  const probe = join(root, `${TRASH_PREFIX}probe.${process.pid}.${randomBytes(4).toString("hex")}`);
  try {
    await mkdir(probe);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? "";
    // A full disk (ENOSPC) or EIO is not configuration: exit 1, restarted.
    if (!["EACCES", "EPERM", "EROFS"].includes(code)) throw error;
    throw new CheckpointError("invalid_request", `checkpoint_root ${root} is not writable by this process (${code}: ${(error as Error).message})`, { cause: error });
  }
  // ENOENT: another coordinator's retention sharing this root swept it first.
  await rmdir(probe).catch((error: NodeJS.ErrnoException) => {
    if (error.code !== "ENOENT") throw error;
  });
}
