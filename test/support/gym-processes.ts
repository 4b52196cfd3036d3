import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { verifyCheckpoint } from "../../coordinator/publication/verify-checkpoint.js";
import { CoordinatorConfigSchema } from "../../coordinator/config/coordinator-config.js";
import { startCoordinator, type CoordinatorHandle } from "../../coordinator/daemon/coordinator-daemon.js";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { FsCheckpointStorage } from "../../participants/storage/fs-storage.js";
import { AgentRecordSchema } from "../../participants/kinds/agent/index.js";
import { EnvironmentRecordSchema } from "../../participants/kinds/environment/index.js";
import { launchGym, type Gym, type GymLaunchOptions, type GymProcessName } from "../../participants/gym/gym-launcher.js";
import { GlobalManifestSchema, type EpisodeId, type Kind, type StatusReply } from "../../protocol/index.js";
import { controlRequest } from "./control-requests.js";
import type { NatsConnection } from "@nats-io/transport-node";
import { startNats, type NatsFixture } from "./nats.js";
import { backendAdmin } from "./policy-backend-admin.js";

/**
 * The e2e world around the reference Gym: a spawned nats-server, an in-process coordinator
 * (controller API over NATS), the Gym processes spawned from dist/, and helpers for the data plane
 * (`/run`), the policy backend's admin routes and participant status. `close()` kills everything.
 */
export const GYM_TOKEN = "gym-e2e-token";
export const CONTROLLER_TOKEN = "gym-e2e-controller";
export const TASK = { expression: "17 + 25", tool_rounds: 1 };
/** Every Gym process except the inference backend: what a crash kills. */
export const GYM_SERVERS: Exclude<GymProcessName, "policy">[] = ["model", "resources", "agent", "environment"];
const KIND_OF: Record<Exclude<GymProcessName, "policy">, Kind> = { model: "model", resources: "resources", agent: "agent", environment: "environment" };

export interface BackendCall {
  seq: number;
  capture_key: string | null;
  model_call_id?: string | null;
  message_count: number;
  stream: boolean;
  continued_from?: string | null;
  delivered?: boolean;
  aborted?: boolean;
  finished?: boolean;
}

export interface RunResult {
  status: number;
  body: any;
}

let counter = 0;

export interface GymWorld {
  nats: NatsFixture;
  root: string;
  deployment: string;
  gym: Gym;
  coordinator: CoordinatorHandle;
  client: NatsControllerClient;
  run(rolloutId: string, attempt?: number, task?: object, via?: "environment" | "agent", headers?: Record<string, string>): Promise<RunResult>;
  /** Retries `/run` refused with `admission_closed` (bounded). */
  runAdmitted(rolloutId: string, attempt?: number, task?: object, via?: "environment" | "agent", headers?: Record<string, string>): Promise<RunResult>;
  backend: {
    calls(): Promise<BackendCall[]>;
    hold(after: number): Promise<void>;
    release(): Promise<void>;
    reset(): Promise<void>;
  };
  status(name: Exclude<GymProcessName, "policy">): Promise<StatusReply>;
  state(name: "environment" | "agent"): Promise<any>;
  /** prepare → commit(scope) → publish, without resume (the crash comes next). */
  checkpointNoResume(id: string, scope: EpisodeId[] | null): Promise<void>;
  /** SIGKILL every Gym process but the backend, let the controller close the checkpoint, start fresh ones. */
  crashAndRestart(openCheckpoint?: string): Promise<void>;
  /** Restore `id` for `scope`, then resume. */
  restoreAndResume(id: string, scope: EpisodeId[]): Promise<void>;
  /** Re-reads a published checkpoint end to end, and every env/agent record against its schema. */
  verify(id: string): Promise<{ records: number }>;
  waitFor(condition: () => Promise<boolean> | boolean, what: string, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

/**
 * GYM_E2E_FAKE_MODEL=1 replaces the model attach proxy by a plain prefix-stripping forwarder (no
 * participant): a debugging aid for when the proxy is not built; model-participant behaviour
 * (held responses, ledger records) is then absent.
 */
const FAKE_MODEL = process.env.GYM_E2E_FAKE_MODEL === "1";

/**
 * A nats-server and a policy backend that the worlds of one test file can share (startGymWorld's
 * `base`), started once instead of once per world. Each world still has its own deployment,
 * checkpoint root, coordinator, Gym servers and NATS connections (closed with it), and the backend's
 * call log, holds, gate and cut mode are reset for it before it is returned.
 */
export interface GymBase {
  nats: NatsFixture;
  policy: Gym;
  close(): Promise<void>;
}

export async function startGymBase(): Promise<GymBase> {
  const nats = await startNats();
  try {
    const policy = await launchGym({
      nats: nats.server.url,
      deployment: `gymbase${process.pid}x${counter++}`,
      token: GYM_TOKEN,
      initial: ["policy"],
      ...(process.env.GYM_E2E_VERBOSE && { onOutput: (name: GymProcessName, line: string) => process.stderr.write(`[${name}] ${line}\n`) }),
    });
    return {
      nats,
      policy,
      async close() {
        await policy.stop().catch(() => undefined);
        await nats.close().catch(() => undefined);
      },
    };
  } catch (error) {
    await nats.close().catch(() => undefined);
    throw error;
  }
}

/** The shared server seen as one world's fixture: its close() closes the connections this world opened, not the server. */
async function worldConnections(shared: NatsFixture): Promise<NatsFixture> {
  const own: NatsConnection[] = [];
  const connect = async () => {
    const nc = await shared.connect();
    own.push(nc);
    return nc;
  };
  return {
    server: shared.server,
    nc: await connect(),
    connect,
    async close() {
      await Promise.allSettled(own.map((nc) => nc.close()));
    },
  };
}

export async function startGymWorld(
  options: { args?: GymLaunchOptions["args"]; external?: GymLaunchOptions["external"]; base?: GymBase; /** Where the world's root is made (default: the system temp dir). */ rootParent?: string } = {},
): Promise<GymWorld> {
  const { base } = options;
  if (base && options.args?.policy) throw new Error("a world on a shared base uses its policy backend as started: no policy args");
  const nats = base ? await worldConnections(base.nats) : await startNats();
  const root = await mkdtemp(join(options.rootParent ?? tmpdir(), "gym-ckpt-e2e-"));
  const deployment = `gym${process.pid}x${counter++}`;
  let gym: Gym | undefined;
  let forwarder: { url: string; close(): Promise<void> } | undefined;
  let coordinator: CoordinatorHandle | undefined;
  try {
    const config = CoordinatorConfigSchema.parse({
      deployment,
      nats: { servers: nats.server.url },
      token: GYM_TOKEN,
      controller_token: CONTROLLER_TOKEN,
      checkpoint_root: root,
      // Long enough that an event-loop stall of this busy test process (the coordinator runs in it)
      // does not cost the lone coordinator its lease mid-test: a re-won lease recovers the open
      // checkpoint (presumed abort), which the tests would see as someone else's resume.
      lease_ms: 1500,
      default_timeout_ms: 10_000,
      request_slack_ms: 2000,
      http: { enabled: false, host: "127.0.0.1", port: 0 },
      log_level: "silent",
    });
    coordinator = await startCoordinator({ config, nc: await nats.connect(), logger: pino({ level: "silent" }) });
    // The Gym processes start while the new leader waits out its lease period (the members bucket
    // exists once startCoordinator returns): ~1.5 s less per world than one after the other.
    const ready = coordinator.whenReady();
    ready.catch(() => undefined); // awaited below; a failed launch must not leave it unhandled
    const client = new NatsControllerClient({ nc: await nats.connect(), deployment, token: CONTROLLER_TOKEN, leaderWaitMs: 8000, slackMs: 3000 });
    gym = await launchGym({
      nats: nats.server.url,
      deployment,
      token: GYM_TOKEN,
      checkpointRoot: root,
      leaseGraceSeconds: 120,
      // The model's capture ledger inside this world's root (removed with it), not the shared default
      // under the system temp directory, where every test deployment would leave one behind.
      args: { ...options.args, model: ["--ledger-dir", join(root, "model-ledger"), ...(options.args?.model ?? [])] },
      ...((options.external || base) && { external: { ...options.external, ...(base && { policy: base.policy.urls.policy! }) } }),
      ...(process.env.GYM_E2E_VERBOSE && { onOutput: (name: GymProcessName, line: string) => process.stderr.write(`[${name}] ${line}\n`) }),
      ...(FAKE_MODEL && { initial: ["policy"] as GymProcessName[] }),
    });
    if (FAKE_MODEL) {
      forwarder = await startPrefixForwarder(gym.urls.policy!);
      gym.urls.model = forwarder.url;
      await gym.start(["resources", "agent", "environment"]);
    }
    await ready;
    // A fresh call log and no hold left over from the base's previous world.
    if (base) await backendAdmin(base.policy.urls.policy!.replace(/\/+$/, ""), "/admin/reset", {});
    const g = gym;
    const c = coordinator;
    const url = (name: GymProcessName) => {
      const u = g.urls[name];
      if (!u) throw new Error(`${name} is not running`);
      return u.replace(/\/+$/, "");
    };
    const waitFor: GymWorld["waitFor"] = async (condition, what, timeoutMs = 20_000) => {
      const until = Date.now() + timeoutMs;
      for (;;) {
        if (await condition()) return;
        if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
    };
    const run: GymWorld["run"] = async (rolloutId, attempt = 0, task = TASK, via = "environment", headers = {}) => {
      const response = await fetch(`${url(via)}/run`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify({ rollout_id: rolloutId, attempt, task }),
      });
      return { status: response.status, body: await response.json() };
    };
    const admin = (path: string, body?: unknown) => backendAdmin(url("policy"), path, body);
    const world: GymWorld = {
      nats,
      root,
      deployment,
      gym: g,
      coordinator: c,
      client,
      run,
      async runAdmitted(rolloutId, attempt = 0, task = TASK, via = "environment", headers = {}) {
        for (let i = 0; i < 400; i++) {
          const result = await run(rolloutId, attempt, task, via, headers);
          if (result.body?.error?.code !== "admission_closed") return result;
          await new Promise((resolve) => setTimeout(resolve, 25));
        }
        throw new Error(`${rolloutId} was never admitted`);
      },
      backend: {
        async calls() {
          const body = await admin("/admin/calls");
          return (Array.isArray(body) ? body : body.calls) as BackendCall[];
        },
        async hold(after) {
          await admin("/admin/hold", { after });
        },
        async release() {
          await admin("/admin/release", {});
        },
        async reset() {
          await admin("/admin/reset", {});
        },
      },
      async status(name) {
        if (FAKE_MODEL && name === "model") return { phase: "idle", retired_rollouts: 0, report: { blocker_count: 0, counts: {} }, extras: {} } as unknown as StatusReply;
        return (await controlRequest(nats.nc, { deployment, kind: KIND_OF[name], instance: g.instances[name], token: GYM_TOKEN }, "status", {}, 5000)) as StatusReply;
      },
      async state(name) {
        const response = await fetch(`${url(name)}/admin/state`);
        return response.json();
      },
      async checkpointNoResume(id, scope) {
        const prepared = await client.prepare({ checkpoint_id: id });
        if (!prepared.prepared) throw new Error(`prepare ${id} not ready: ${JSON.stringify(prepared.blockers)}`);
        await client.commit({ checkpoint_id: id, episode_ids: scope });
        await client.publish({ checkpoint_id: id });
      },
      async crashAndRestart(openCheckpoint) {
        await g.kill(GYM_SERVERS, "SIGKILL");
        if (FAKE_MODEL) {
          if (openCheckpoint) await client.resume({ checkpoint_id: openCheckpoint }).catch(() => undefined);
          await g.start(["resources", "agent", "environment"]);
          return;
        }
        // The controller closes the checkpoint it no longer drives (the dead participants cannot answer).
        if (openCheckpoint) await client.resume({ checkpoint_id: openCheckpoint }).catch(() => undefined);
        await g.start(GYM_SERVERS);
      },
      async restoreAndResume(id, scope) {
        await client.restore({ checkpoint_id: id, episode_ids: scope });
        await client.resume({ checkpoint_id: id });
      },
      async verify(id) {
        const report = await verifyCheckpoint(new CheckpointCatalog(root), id);
        const manifest = GlobalManifestSchema.parse(await new CheckpointCatalog(root).get(id));
        const storage = new FsCheckpointStorage();
        for (const p of manifest.participants) {
          const schema = p.kind === "environment" ? EnvironmentRecordSchema : p.kind === "agent" ? AgentRecordSchema : undefined;
          if (!schema) continue;
          await storage.read({ checkpointDir: new CheckpointCatalog(root).dirFor(id), checkpointId: id, kind: p.kind, instance: p.instance }, schema as never);
        }
        return { records: report.records };
      },
      waitFor,
      async close() {
        await g.stop().catch(() => undefined);
        await forwarder?.close().catch(() => undefined);
        await c.stop().catch(() => undefined);
        await nats.close().catch(() => undefined);
        await rm(root, { recursive: true, force: true });
      },
    };
    return world;
  } catch (error) {
    await gym?.stop().catch(() => undefined);
    await forwarder?.close().catch(() => undefined);
    await coordinator?.stop().catch(() => undefined);
    await nats.close().catch(() => undefined);
    await rm(root, { recursive: true, force: true });
    throw error;
  }
}

/**
 * A tiny in-test policy following the reference contract (deterministic tool call, then the tool's
 * result as the answer), for data-plane tests that do not need the model participant. It records
 * every call and can hold calls beyond the Nth until released.
 */
export interface StubPolicy {
  url: string;
  calls: { capture_key: string; message_count: number }[];
  hold(after: number): void;
  release(): void;
  close(): Promise<void>;
}

export async function startStubPolicy(): Promise<StubPolicy> {
  const { default: Fastify } = await import("fastify");
  const app = Fastify({ logger: false });
  const calls: StubPolicy["calls"] = [];
  let holdAfter: number | undefined;
  let released: (() => void) | undefined;
  let gate: Promise<void> | undefined;
  app.post("/ng-rollout/:key/v1/chat/completions", async (request) => {
    const body = request.body as { messages: { role: string; content: string | null }[]; metadata?: { tool_rounds?: string }; stream?: boolean };
    calls.push({ capture_key: (request.params as { key: string }).key, message_count: body.messages.length });
    if (holdAfter !== undefined && calls.length > holdAfter && gate) await gate;
    const lastUser = body.messages.map((m) => m.role).lastIndexOf("user");
    const toolsSince = body.messages.slice(lastUser + 1).filter((m) => m.role === "tool");
    const rounds = Number(body.metadata?.tool_rounds ?? "1");
    const user = body.messages[lastUser]?.content ?? "";
    const message =
      toolsSince.length < rounds
        ? { role: "assistant", content: null, tool_calls: [{ id: `call_${calls.length}`, type: "function", function: { name: "calculator", arguments: JSON.stringify({ expression: user.slice(user.lastIndexOf("Compute:") + 8).trim() }) } }] }
        : { role: "assistant", content: String((JSON.parse(toolsSince.at(-1)?.content ?? "{}") as { result?: unknown }).result ?? "") };
    return { id: "stub", object: "chat.completion", choices: [{ index: 0, message, finish_reason: "stop" }] };
  });
  const url = await app.listen({ host: "127.0.0.1", port: 0 });
  const stub: StubPolicy = {
    url,
    calls,
    hold(after) {
      holdAfter = after;
      gate = new Promise((resolve) => (released = resolve));
    },
    release() {
      holdAfter = undefined;
      released?.();
      gate = undefined;
    },
    async close() {
      stub.release();
      await app.close();
    },
  };
  return stub;
}

/** Strips `/ng-rollout/<key>` and forwards to the backend with `x-ng-capture-key` (GYM_E2E_FAKE_MODEL only). */
async function startPrefixForwarder(upstream: string): Promise<{ url: string; close(): Promise<void> }> {
  const { default: Fastify } = await import("fastify");
  const app = Fastify({ logger: false });
  app.post("/ng-rollout/:key/*", async (request, reply) => {
    const { key } = request.params as { key: string };
    const rest = (request.params as { "*": string })["*"];
    const response = await fetch(`${upstream.replace(/\/+$/, "")}/${rest}`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-ng-capture-key": key },
      body: JSON.stringify(request.body),
    });
    const text = await response.text();
    return reply.code(response.status).header("content-type", response.headers.get("content-type") ?? "application/json").send(text);
  });
  const url = await app.listen({ host: "127.0.0.1", port: 0 });
  return { url, close: () => app.close() };
}
