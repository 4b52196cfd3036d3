import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterAll, beforeAll } from "vitest";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { CoordinatorConfigSchema, type CoordinatorConfig } from "../../coordinator/config/coordinator-config.js";
import { startCoordinator, type CoordinatorHandle, type CoordinatorHooks } from "../../coordinator/daemon/coordinator-daemon.js";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import type { EpisodeId, Kind } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

export const PARTICIPANT_TOKEN = "participant-token";
export const CONTROLLER_TOKEN = "controller-token";

/** A global, ordered log of every hook any in-process participant ran. */
export const hookLog: string[] = [];

/** ScriptableKind that also writes each hook into the shared, ordered hook log. */
export class LoggedKind extends ScriptableKind {
  constructor(
    kind: Kind,
    readonly instance: string,
  ) {
    super(kind);
  }
  override async closeAdmission(): Promise<void> {
    hookLog.push(`close:${this.kind}/${this.instance}`);
    return super.closeAdmission();
  }
  override async openAdmission(): Promise<void> {
    hookLog.push(`open:${this.kind}/${this.instance}`);
    return super.openAdmission();
  }
  override async exportRecords(scope: Parameters<ScriptableKind["exportRecords"]>[0]): Promise<ScriptRecord[]> {
    hookLog.push(`export:${this.kind}/${this.instance}`);
    return super.exportRecords(scope);
  }
  override async retire(episodes: Parameters<ScriptableKind["retire"]>[0]): Promise<void> {
    hookLog.push(`retire:${this.kind}/${this.instance}`);
    return super.retire(episodes);
  }
  override async forget(rolloutIds: string[]): Promise<void> {
    hookLog.push(`forget:${this.kind}/${this.instance}`);
    return super.forget(rolloutIds);
  }
}

export interface RunningParticipant {
  kind: Kind;
  instance: string;
  adapter: LoggedKind;
  handle: ParticipantHandle<ScriptRecord>;
}

export const DEFAULT_MEMBERS: { kind: Kind; instance: string }[] = [
  { kind: "environment", instance: "env1" },
  { kind: "model", instance: "policy" },
  { kind: "agent", instance: "agent1" },
  { kind: "agent", instance: "agent2" },
  { kind: "resources", instance: "tools" },
];

/** Config overrides for a coordinator that serves no HTTP API (most tests drive it over NATS). */
export const NO_HTTP = { http: { enabled: false, host: "127.0.0.1", port: 0 } };

export interface World {
  nats: NatsFixture;
  deployment: string;
  root: string;
  pnc: NatsConnection;
  participants: RunningParticipant[];
  coordinators: CoordinatorHandle[];
  client: NatsControllerClient;
  config(overrides?: Partial<CoordinatorConfig>): CoordinatorConfig;
  /** `hooks`: the engine's and the daemon's test-only fault injection points. */
  startCoordinator(overrides?: Partial<CoordinatorConfig>, options?: { hooks?: CoordinatorHooks }): Promise<CoordinatorHandle>;
  /** `announce: false`: subscribed but not (yet) in the membership registry. */
  startParticipants(members?: { kind: Kind; instance: string }[], options?: { announce?: boolean }): Promise<RunningParticipant[]>;
  stopParticipants(): Promise<void>;
  participant(instance: string): RunningParticipant;
  close(): Promise<void>;
}

let counter = 0;

/** `deployment`: its name (a fresh one unless given, so worlds sharing a NATS server stay apart). */
export async function startWorld(options: { nats?: NatsFixture; deployment?: string } = {}): Promise<World> {
  const nats = options.nats ?? (await startNats());
  const deployment = options.deployment ?? `d${process.pid}x${counter++}`;
  const root = await mkdtemp(join(tmpdir(), "gym-ckpt-coord-"));
  const pnc = await nats.connect();
  const cnc = await nats.connect();
  const world: World = {
    nats,
    deployment,
    root,
    pnc,
    participants: [],
    coordinators: [],
    client: new NatsControllerClient({ nc: cnc, deployment, token: CONTROLLER_TOKEN, leaderWaitMs: 8000, slackMs: 3000 }),
    config(overrides = {}) {
      return CoordinatorConfigSchema.parse({
        deployment,
        nats: { servers: nats.server.url },
        token: PARTICIPANT_TOKEN,
        controller_token: CONTROLLER_TOKEN,
        checkpoint_root: root,
        lease_ms: 500,
        default_timeout_ms: 5000,
        request_slack_ms: 1000,
        http: { enabled: true, host: "127.0.0.1", port: 0 },
        log_level: "silent",
        ...overrides,
      });
    },
    async startCoordinator(overrides = {}, { hooks } = {}) {
      const handle = await startCoordinator({ config: world.config(overrides), nc: await nats.connect(), logger: pino({ level: "silent" }), ...(hooks && { hooks }) });
      world.coordinators.push(handle);
      return handle;
    },
    async startParticipants(members = DEFAULT_MEMBERS, { announce = true } = {}) {
      const started = await Promise.all(
        members.map(async ({ kind, instance }) => {
          const adapter = new LoggedKind(kind, instance);
          const handle = await startParticipant({ nc: pnc, deployment, instance, token: PARTICIPANT_TOKEN, adapter, announce, logger: pino({ level: "silent" }) });
          return { kind, instance, adapter, handle };
        }),
      );
      world.participants.push(...started);
      return started;
    },
    async stopParticipants() {
      await Promise.all(world.participants.map((p) => p.handle.stop()));
      world.participants.length = 0;
    },
    participant(instance) {
      const found = world.participants.find((p) => p.instance === instance);
      if (!found) throw new Error(`no participant ${instance}`);
      return found;
    },
    async close() {
      await Promise.allSettled(world.coordinators.map((c) => c.stop()));
      await world.stopParticipants().catch(() => undefined);
      if (!options.nats) await nats.close();
      await rm(root, { recursive: true, force: true });
    },
  };
  return world;
}

/**
 * One world for a test file: the default participants and a ready leader serving no HTTP, started
 * before its tests and closed after them. Call the returned function inside a test.
 */
export function worldWithLeader(): () => World {
  let world: World | undefined;
  beforeAll(async () => {
    world = await startWorld();
    await world.startParticipants();
    await (await world.startCoordinator(NO_HTTP)).whenReady();
  });
  afterAll(async () => {
    await world?.close();
  });
  return () => world!;
}

/** Records every participant-subject message in publish order: `${op}:${kind}/${instance}@${epoch}`. */
/**
 * For a restore after a crash: checkpoint `id` with `episode` held at env1, policy and agent1,
 * then every participant replaced by a fresh process, agent1's started by `startAgent` (one that
 * stalls, say). Resolves with what `startAgent` returned once the leader's view shows them all.
 */
export async function checkpointThenFreshProcesses<T>(world: World, id: string, episode: EpisodeId, startAgent: () => Promise<T>): Promise<T> {
  for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode(episode, { n: 1 });
  await world.client.checkpoint({ checkpoint_id: id });
  await world.stopParticipants();
  await world.startParticipants(DEFAULT_MEMBERS.filter((m) => m.instance !== "agent1"));
  const agent = await startAgent();
  const coordinator = world.coordinators[0]!;
  await waitUntil(() => world.participants.every((p) => coordinator.members.incarnationOf(p) === p.handle.controlPlane.incarnation), "the fresh processes in the view");
  return agent;
}

/** A participant process outside the world's list, on a connection of its own (closing it is its SIGKILL), one hook held until `release`. */
export interface StalledProcess<A extends LoggedKind> {
  nc: NatsConnection;
  adapter: A;
  handle: ParticipantHandle<ScriptRecord>;
  release: () => void;
}

/** Starts `adapter`'s process with its `hook` held (see StalledProcess); resolves once the leader's view shows it. */
export async function startStalledProcess<A extends LoggedKind>(world: World, adapter: A, hook: Parameters<ScriptableKind["delay"]>[0]): Promise<StalledProcess<A>> {
  const nc = await world.nats.connect();
  let release!: () => void;
  adapter.delay(hook, new Promise<void>((resolve) => (release = resolve)));
  const handle = await startParticipant({ nc, deployment: world.deployment, instance: adapter.instance, token: PARTICIPANT_TOKEN, adapter, logger: pino({ level: "silent" }) });
  const coordinator = world.coordinators[0]!;
  await waitUntil(() => coordinator.members.incarnationOf(adapter) === handle.controlPlane.incarnation, `${adapter.instance} in the view`);
  return { nc, adapter, handle, release };
}

export function monitorPhaseMessages(nc: NatsConnection, deployment: string): { log: { op: string; target: string; epoch: number | undefined }[]; stop(): void } {
  const log: { op: string; target: string; epoch: number | undefined }[] = [];
  const sub = nc.subscribe(`gym.ckpt.v1.${deployment}.p.>`, {
    callback: (_err, msg) => {
      const parts = msg.subject.split(".");
      if (parts[7] === "status") return; // a read-only probe (recovery asks every participant), not a phase message
      let epoch: number | undefined;
      try {
        epoch = (JSON.parse(msg.string()) as { epoch?: number }).epoch;
      } catch {
        epoch = undefined;
      }
      log.push({ op: parts[7]!, target: `${parts[5]}/${parts[6]}`, epoch });
    },
  });
  return { log, stop: () => sub.unsubscribe() };
}

export const KIND_OF = (target: string) => target.split("/")[0] as Kind;
