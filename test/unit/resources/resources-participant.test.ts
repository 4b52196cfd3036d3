import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { FastifyInstance } from "fastify";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError, type PhaseOp, type RecordBase, type RequestInputOf } from "../../../protocol/index.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import {
  REPLAYABLE_END_HOLD_MS,
  ResourcesServer,
  createResourcesApp,
  declarationsOf,
  type CheckpointMode,
  type CheckpointVerify,
  type JsonValue,
  type ResourcesKind,
  type SessionAccess,
} from "../../../participants/kinds/resources/index.js";
import { CalculatorServer, calculatorServerClass } from "../../../participants/gym/resources-server/calculator-server.js";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { refusalCode } from "../../support/refusal.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";

let root: string;
const opened: { app: FastifyInstance; plane: ParticipantControlPlane<any> }[] = [];

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-res-"));
});

afterEach(async () => {
  for (const { app, plane } of opened.splice(0)) {
    plane.dispose();
    await app.close();
  }
  await rm(root, { recursive: true, force: true });
});

async function harness(server: ResourcesServer) {
  const clock = new ManualClock();
  const { app, kind, sessions } = await createResourcesApp(server, { owner: "worker-0", clock });
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "res0", checkpointRoot: root, readinessPollMs: 50 });
  opened.push({ app, plane });
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }, deadlineS = 30) => {
    const request: Record<string, unknown> = { deadline_ts: Date.now() / 1000 + deadlineS, epoch: 1, ...body };
    if (op === "commit" || op === "restore") {
      Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, ...(op === "commit" ? { stop: false } : {}), ...body });
      if (op === "commit" && !("checkpoint_dir" in body)) createCheckpointDir(root, body.checkpoint_id);
    }
    return plane.handle(op, request as never);
  };
  const post = (url: string, payload: object = {}, cookie?: string) =>
    app.inject({ method: "POST", url, payload, ...(cookie ? { headers: { cookie } } : {}) });
  const seed = async (key: string, task: object = { expression: "17 + 25" }) => {
    const reply = await post(`/ng-rollout/${key}/seed_session`, { task });
    expect(reply.statusCode).toBe(200);
    return String(reply.headers["set-cookie"]).split(";")[0]!;
  };
  return { app, kind, sessions, plane, call, post, seed, clock };
}

const refused = refusalCode;

/** Bounded polling on a condition (no sleeps for correctness). */
async function until(condition: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

async function readRecords(checkpointId: string): Promise<any[]> {
  const dir = join(root, checkpointId, "gym", "resources", "res0");
  const file = (await readdir(dir)).find((name) => name.startsWith("records-"))!;
  return (await readFile(join(dir, file), "utf8")).split("\n").filter(Boolean).map((line) => JSON.parse(line));
}

const verifyBody = (answer = "42") => ({ task: { expression: "17 + 25" }, answer });


/** A checkpoint of this test's resources participant (res0) holding `records`, as its commit writes it. */
function writeCheckpoint(id: string, records: RecordBase[]) {
  return new FsCheckpointStorage().write({ checkpointDir: join(root, id), checkpointId: id, kind: "resources", instance: "res0" }, records, {
    gate: new WriteGate(),
    createdAt: Date.now() / 1000,
    extra: {},
  });
}

describe("verify in flight: replay vs wait", () => {
  it("replay: an early prepare succeeds, the session is exported, and verify runs again after restore", async () => {
    const server = new CalculatorServer();
    const a = await harness(server);
    const cookie = await a.seed("r1");
    server.controls.hold();
    const inflight = a.post("/ng-rollout/r1/verify", verifyBody(), cookie);
    await until(() => server.controls.stats.verify_started === 1, "verify to start");

    const prepared = await a.call("prepare", { checkpoint_id: "c1" }, 1);
    expect(prepared).toMatchObject({ phase: "prepared", report: { ready: true, blockers: [], counts: { inflight: 0, sessions: 1 } } });
    const committed = await a.call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(committed.episode_ids).toEqual(["r1"]);
    const records = await readRecords("c1");
    expect(records).toEqual([{ episode_id: { rollout_id: "r1", attempt: 0 }, session_id: cookie.split("=")[1], state: null, owner: "worker-0" }]);
    // The process crashes here: the verify never answers.

    const freshServer = new CalculatorServer();
    const b = await harness(freshServer);
    const restored = await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(restored).toEqual({ phase: "restored", source_checkpoint_id: "c1", restored: ["r1-a1"], incarnation: expect.any(String) });
    // Data requests wait until resume; the replayed verify of the replacement attempt is admitted.
    const replay = b.post("/ng-rollout/r1-a1/verify", verifyBody(), cookie);
    expect((await b.call("resume", { checkpoint_id: "c1" })).phase).toBe("idle");
    expect((await replay).json()).toEqual({ reward: 1 });
    expect(freshServer.controls.stats.verify_finished).toBe(1);
    // Held a while after its replayable verify (a checkpoint may be under way), then ended.
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 1, restored: 0 });
    b.clock.advance(REPLAYABLE_END_HOLD_MS);
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 0, restored: 0 });

    server.controls.release();
    await inflight;
  });

  it("wait: the prepare reports the episode as a blocker and verify never runs twice", async () => {
    const Server = calculatorServerClass("stateless", "wait");
    const server = new Server();
    const a = await harness(server);
    const cookie = await a.seed("r1");
    server.controls.hold();
    const inflight = a.post("/ng-rollout/r1/verify", verifyBody(), cookie);
    await until(() => server.controls.stats.verify_started === 1, "verify to start");

    const early = await a.call("prepare", { checkpoint_id: "c1" }, 0.3);
    expect(early).toMatchObject({ phase: "preparing", report: { ready: false, blockers: ["r1"], counts: { inflight: 1, sessions: 1 } } });
    server.controls.release();
    expect((await inflight).json()).toEqual({ reward: 1 });
    const prepared = await a.call("prepare", { checkpoint_id: "c1" });
    expect(prepared).toMatchObject({ phase: "prepared", report: { ready: true, counts: { inflight: 0, sessions: 0 } } });
    const committed = await a.call("commit", { checkpoint_id: "c1" });
    expect(committed.episode_ids).toEqual([]);
    expect(server.controls.stats.verify_started).toBe(1);
    expect(server.controls.stats.verify_finished).toBe(1);
  });

  it("in-flight counting excludes a replayable verify but counts every other request", async () => {
    const server = new CalculatorServer();
    const a = await harness(server);
    const cookie = await a.seed("r1");
    server.controls.hold();
    const pending = a.post("/ng-rollout/r1/verify", verifyBody(), cookie);
    await until(() => server.controls.stats.verify_started === 1, "verify to start");
    expect(a.kind.readiness()).toMatchObject({ blockers: [], counts: { inflight: 0 } });
    server.controls.release();
    await pending;
  });
});

describe("stateless and exported restore", () => {
  class SpyStateless extends ResourcesServer {
    static override readonly checkpointMode: CheckpointMode = "stateless";
    static override readonly checkpointVerify: CheckpointVerify = "replay";
    readonly hookCalls: string[] = [];
    routes(app: FastifyInstance, sessions: SessionAccess): void {
      app.post("/seed_session", async (request) => (sessions.require(request), {}));
      app.post("/step", async () => ({ ok: true }));
    }
    override async exportSessionStates(): Promise<Record<string, JsonValue>> {
      this.hookCalls.push("export");
      return {};
    }
    override async restoreSessionStates(): Promise<void> {
      this.hookCalls.push("restore");
    }
  }

  it("a stateless server records live sessions with state null and restores them without hooks", async () => {
    const first = new SpyStateless();
    const a = await harness(first);
    const c1 = await a.seed("r1");
    await a.seed("r2-a3");
    await a.call("prepare", { checkpoint_id: "c1" });
    await a.call("commit", { checkpoint_id: "c1" });
    const records = await readRecords("c1");
    expect(records.map((r) => [r.episode_id, r.state, r.owner])).toEqual(
      expect.arrayContaining([
        [{ rollout_id: "r1", attempt: 0 }, null, "worker-0"],
        [{ rollout_id: "r2", attempt: 3 }, null, "worker-0"],
      ]),
    );

    const second = new SpyStateless();
    const b = await harness(second);
    const restored = await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 3 }] });
    expect(restored.restored).toEqual(["r1-a1", "r2-a4"]);
    expect([...first.hookCalls, ...second.hookCalls]).toEqual([]);
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 2, restored: 2 });
    await b.call("resume", { checkpoint_id: "c1" });
    // The cookie keeps working under the next attempt; the old attempt is refused.
    expect((await b.post("/ng-rollout/r1/step", {}, c1)).json().error.code).toBe("stale_attempt");
    expect((await b.post("/ng-rollout/r1-a1/step", {}, c1)).json()).toEqual({ ok: true });
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 2, restored: 1 });
  });

  it("an exported counter survives restore; a session the server dropped is skipped, not a failure", async () => {
    const server = new CounterServer();
    const a = await harness(server);
    const c1 = await a.seed("r1");
    const c2 = await a.seed("r2");
    expect((await a.post("/ng-rollout/r1/increment", {}, c1)).json()).toEqual({ count: 1 });
    expect((await a.post("/ng-rollout/r1/increment", {}, c1)).json()).toEqual({ count: 2 });
    server.counters.delete(c2.split("=")[1]!); // the server dropped r2's session by itself
    await a.call("prepare", { checkpoint_id: "c1" });
    const committed = await a.call("commit", { checkpoint_id: "c1" });
    expect(committed.episode_ids).toEqual(["r1"]);
    expect((await readRecords("c1")).map((r) => r.state)).toEqual([{ count: 2 }]);

    const fresh = new CounterServer();
    const b = await harness(fresh);
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const next = b.post("/ng-rollout/r1-a1/increment", {}, c1);
    await until(() => b.kind.readiness().counts.waiting === 1, "the request to wait for resume");
    await b.call("resume", { checkpoint_id: "c1" });
    expect((await next).json()).toEqual({ count: 3 });
  });

  // Reference §4.1: record lines keep the exporter's key order; the restored state is the exported one, exactly.
  it("exported session state keeps the exporter's key order on disk and into the restore hook", async () => {
    const state = { zeta: { b: 1, a: [{ d: 1, c: 2 }] }, count: 2, alpha: "x" };
    class OrderedState extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "exported";
      restored = "";
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/seed_session", async (request) => (sessions.require(request), {}));
      }
      override async exportSessionStates(ids: string[]): Promise<Record<string, JsonValue>> {
        return Object.fromEntries(ids.map((id) => [id, state]));
      }
      override async restoreSessionStates(states: Record<string, JsonValue>): Promise<void> {
        this.restored = JSON.stringify(Object.values(states)[0]);
      }
      override async retireSessionState(): Promise<void> {}
    }
    const a = await harness(new OrderedState());
    await a.seed("r1");
    await a.call("prepare", { checkpoint_id: "c1" });
    await a.call("commit", { checkpoint_id: "c1" });
    const dir = join(root, "c1", "gym", "resources", "res0");
    const line = await readFile(join(dir, (await readdir(dir)).find((f) => f.startsWith("records-"))!), "utf8");
    expect(line).toContain(`"state":${JSON.stringify(state)}`);
    const fresh = new OrderedState();
    const b = await harness(fresh);
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(fresh.restored).toBe(JSON.stringify(state));
  });

  it("corrupt exported state installs nothing and leaves the server idle", async () => {
    // A checkpoint whose files are intact but one session's state is invalid for the server.
    const records = [
      { episode_id: { rollout_id: "r1", attempt: 0 }, session_id: "sessionAAAA", state: { count: 2 }, owner: null },
      { episode_id: { rollout_id: "r2", attempt: 0 }, session_id: "sessionBBBB", state: { count: -1 }, owner: null },
    ];
    await writeCheckpoint("c1", records);
    const fresh = new CounterServer();
    const b = await harness(fresh);
    const scope = [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 0 }];
    expect(await refused(b.call("restore", { checkpoint_id: "c1", episode_ids: scope }))).toBe("invalid_checkpoint_state");
    expect(b.plane.currentPhase).toBe("idle");
    expect(fresh.counters.size).toBe(0);
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 0, restored: 0, inflight: 0 });
    expect(b.kind.statusExtras()).toMatchObject({ accepting: true });
    // Nothing was installed, so a valid restore can still follow in the same process.
    await writeCheckpoint("c2", [records[0]!]);
    expect((await b.call("restore", { checkpoint_id: "c2", episode_ids: scope })).restored).toEqual(["r1-a1"]);
    expect(fresh.counters.get("sessionAAAA")).toBe(2);
  });

  it("a session id that names an Object.prototype member (__proto__, constructor) reaches the restore hook with its state", async () => {
    // Valid session ids; assigned into a plain object, `__proto__` set its prototype instead, so
    // the server never got that session's state while the kind installed the session.
    const records = [
      { episode_id: { rollout_id: "r1", attempt: 0 }, session_id: "__proto__", state: { count: 2 }, owner: null },
      { episode_id: { rollout_id: "r2", attempt: 0 }, session_id: "constructor", state: { count: 5 }, owner: null },
    ];
    await writeCheckpoint("c1", records);
    const fresh = new CounterServer();
    const b = await harness(fresh);
    const scope = [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 0 }];
    expect((await b.call("restore", { checkpoint_id: "c1", episode_ids: scope })).restored).toEqual(["r1-a1", "r2-a1"]);
    expect(Object.fromEntries(fresh.counters)).toEqual({ ["__proto__"]: 2, constructor: 5 });
    await b.call("resume", { checkpoint_id: "c1" });
  });

  it("a tampered records file fails the restore before any hook", async () => {
    const server = new CounterServer();
    const a = await harness(server);
    await a.seed("r1");
    await a.call("prepare", { checkpoint_id: "c1" });
    await a.call("commit", { checkpoint_id: "c1" });
    const dir = join(root, "c1", "gym", "resources", "res0");
    const file = (await readdir(dir)).find((name) => name.startsWith("records-"))!;
    await writeFile(join(dir, file), '{"episode_id":{"rollout_id":"r1","attempt":0},"session_id":"x","state":1,"owner":null}\n');
    const fresh = new CounterServer();
    const b = await harness(fresh);
    expect(await refused(b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("invalid_checkpoint_state");
    expect(b.plane.currentPhase).toBe("idle");
    expect(fresh.counters.size).toBe(0);
  });
});

describe("admission during a checkpoint", () => {
  it("a close during a checkpoint waits for resume and then ends the session", async () => {
    const a = await harness(new CalculatorServer());
    const cookie = await a.seed("r1");
    await a.call("prepare", { checkpoint_id: "c1" });
    let answered = false;
    const close = a.post("/ng-rollout/r1/close_session", {}, cookie).then((reply) => ((answered = true), reply));
    await until(() => a.kind.readiness().counts.waiting === 1, "the close to wait");
    expect(answered).toBe(false);
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1, inflight: 0 });
    await a.call("commit", { checkpoint_id: "c1" });
    expect(answered).toBe(false);
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await close).statusCode).toBe(200);
    expect(a.kind.readiness().counts.sessions).toBe(0);
  });

  it("a seed waits while admission is closed, and a seed already in flight holds up prepare", async () => {
    class SlowSeed extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "stateless";
      release: () => void = () => undefined;
      readonly gate = new Promise<void>((resolve) => (this.release = resolve));
      entered = 0;
      routes(app: FastifyInstance): void {
        app.post("/seed_session", async () => {
          this.entered += 1;
          await this.gate;
          return {};
        });
      }
    }
    const server = new SlowSeed();
    const a = await harness(server);
    const seed = a.post("/ng-rollout/r1/seed_session", {});
    await until(() => server.entered === 1, "the seed to start");
    const early = await a.call("prepare", { checkpoint_id: "c1" }, 0.2);
    expect(early).toMatchObject({ phase: "preparing", report: { blockers: ["r1"], counts: { inflight: 1, sessions: 0 } } });
    server.release();
    await seed;
    expect((await a.call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
    const late = a.post("/ng-rollout/r2/seed_session", {});
    await until(() => a.kind.readiness().counts.waiting === 1, "the late seed to wait");
    expect(server.entered).toBe(1);
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await late).statusCode).toBe(200);
    expect(a.kind.readiness().counts.sessions).toBe(2);
  });

  it("a seed's session is bound before the seed stops counting in flight", async () => {
    const { app, kind } = await createResourcesApp(new CalculatorServer());
    const seen: { inflight: number; sessions: number }[] = [];
    kind.attach({ notifyReadinessChanged: () => seen.push({ inflight: kind.readiness().counts.inflight!, sessions: kind.readiness().counts.sessions! }), isRetired: () => false });
    const reply = await app.inject({ method: "POST", url: "/ng-rollout/r1/seed_session", payload: { task: { expression: "1" } } });
    await app.close();
    expect(reply.statusCode).toBe(200);
    // What a waiting prepare reads when the seed is released: no longer in flight, session there.
    expect(seen).toEqual([{ inflight: 1, sessions: 0 }, { inflight: 0, sessions: 1 }]);
  });

  it("restart-only: sessions are restarts, a commit naming one is refused, only seeds wait", async () => {
    const Server = calculatorServerClass("restart_only", "wait");
    const a = await harness(new Server());
    const cookie = await a.seed("r1");
    await a.seed("r2-a1");
    const prepared = await a.call("prepare", { checkpoint_id: "c1" });
    expect(prepared.report).toMatchObject({ ready: true, restarts: ["r1", "r2-a1"] });
    // Other requests keep being served during the checkpoint and never count in flight.
    expect((await a.post("/ng-rollout/r1/tools/calculator", { expression: "2*3" }, cookie)).json()).toEqual({ result: "6" });
    const seed = a.post("/ng-rollout/r3/seed_session", { task: { expression: "1" } });
    await until(() => a.kind.readiness().counts.waiting === 1, "the seed to wait");
    expect(await refused(a.call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("restart_in_scope");
    const committed = await a.call("commit", { checkpoint_id: "c1", episode_ids: [] });
    expect(committed.episode_ids).toEqual([]);
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await seed).headers["x-ng-checkpoint-restart"]).toBe("1");
    expect(a.kind.readiness().restarts).toEqual(["r1", "r2-a1", "r3"]);
  });

  it("a server class that declares no mode is restart-only (fails closed): its sessions are restarts, never exported", async () => {
    class Undeclared extends ResourcesServer {
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/seed_session", async (request) => (sessions.require(request), {}));
      }
    }
    const server = new Undeclared();
    expect(declarationsOf(server)).toEqual({ mode: "restart_only", verify: "wait" });
    const a = await harness(server);
    await a.seed("r1");
    const prepared = await a.call("prepare", { checkpoint_id: "c1" });
    expect(prepared.report).toMatchObject({ ready: true, restarts: ["r1"] });
    expect(await refused(a.call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("restart_in_scope");
    expect((await a.call("commit", { checkpoint_id: "c1", episode_ids: null })).episode_ids).toEqual([]);
    await a.call("resume", { checkpoint_id: "c1" });
  });

  it("restart-only: a reset-style route starts no session while admission is closed", async () => {
    class Gymnasium extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "restart_only";
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/reset", async (request) => ({ session: sessions.started(request) }));
      }
    }
    const a = await harness(new Gymnasium());
    await a.post("/ng-rollout/g1/reset");
    const prepared = await a.call("prepare", { checkpoint_id: "c1" });
    expect(prepared.report).toMatchObject({ ready: true, restarts: ["g1"] });
    const during = await a.post("/ng-rollout/g2/reset");
    expect(during.statusCode).toBe(409);
    expect(during.json().error.code).toBe("admission_closed");
    expect(during.headers["set-cookie"]).toBeUndefined();
    expect(a.kind.readiness()).toMatchObject({ restarts: ["g1"], counts: { sessions: 1 } });
    expect((await a.call("commit", { checkpoint_id: "c1", episode_ids: [] })).episode_ids).toEqual([]);
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await a.post("/ng-rollout/g2/reset")).statusCode).toBe(200);
    expect(a.kind.readiness().restarts).toEqual(["g1", "g2"]);
  });

  it("a percent-encoded seed route is classified as the seed Fastify runs: it waits on restart_only", async () => {
    const Server = calculatorServerClass("restart_only", "wait");
    const a = await harness(new Server());
    const seeded = await a.post("/ng-rollout/r1/%73eed_session", { task: { expression: "1" } });
    expect(seeded.statusCode).toBe(200);
    expect(seeded.headers["x-ng-checkpoint-restart"]).toBe("1");
    expect(a.kind.readiness().restarts).toEqual(["r1"]);
    await a.call("prepare", { checkpoint_id: "c1" });
    const late = a.post("/ng-rollout/r2/seed_sessio%6E", { task: { expression: "1" } });
    await until(() => a.kind.readiness().counts.waiting === 1, "the encoded seed to wait");
    expect(a.kind.readiness().restarts).toEqual(["r1"]);
    await a.call("commit", { checkpoint_id: "c1", episode_ids: [] });
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await late).statusCode).toBe(200);
    expect(a.kind.readiness().restarts).toEqual(["r1", "r2"]);
  });

  it("restart-only servers cannot restore records", async () => {
    const a = await harness(new CalculatorServer());
    await a.seed("r1");
    await a.call("prepare", { checkpoint_id: "c1" });
    await a.call("commit", { checkpoint_id: "c1" });
    const Server = calculatorServerClass("restart_only", "wait");
    const b = await harness(new Server());
    expect(await refused(b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("invalid_checkpoint_state");
    expect(b.plane.currentPhase).toBe("idle");
  });
});

describe("retire, forget and the lifecycle", () => {
  it("retire waits for the session's requests, frees it, and its requests get stale_attempt until forget", async () => {
    let releaseHeld!: () => void;
    const held = new Promise<void>((resolve) => (releaseHeld = resolve));
    let inside = 0;
    class HoldingCounter extends CounterServer {
      override routes(app: FastifyInstance, sessions: SessionAccess): void {
        super.routes(app, sessions);
        app.post("/slow_increment", async (request) => {
          inside += 1;
          await held;
          const { sessionId } = sessions.require(request);
          this.counters.set(sessionId, (this.counters.get(sessionId) ?? 0) + 1);
          return {};
        });
      }
    }
    const server = new HoldingCounter();
    const a = await harness(server);
    const cookie = await a.seed("r1");
    await a.post("/ng-rollout/r1/increment", {}, cookie);
    const slow = a.post("/ng-rollout/r1/slow_increment", {}, cookie);
    await until(() => inside === 1, "the increment to start");
    let retired = false;
    const retire = a.call("retire", { checkpoint_id: "r", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }).then(() => (retired = true));
    await until(() => a.kind.readiness().blockers.includes("r1") && a.kind.statusExtras().retired_sessions === 1, "the retire to mark");
    expect(retired).toBe(false);
    expect(server.counters.size).toBe(1);
    releaseHeld();
    await slow;
    await retire;
    expect(server.counters.size).toBe(0);
    expect(a.kind.readiness()).toMatchObject({ blockers: [], counts: { sessions: 0, inflight: 0 } });
    expect((await a.post("/ng-rollout/r1/increment", {}, cookie)).json().error.code).toBe("stale_attempt");
    // The cookie alone is fenced too, whatever prefix it comes back under.
    expect((await a.post("/ng-rollout/other/increment", {}, cookie)).json().error.code).toBe("stale_attempt");
    // A close is never refused.
    expect((await a.post("/ng-rollout/r1/close_session", {}, cookie)).statusCode).toBe(200);
    await a.call("forget", { checkpoint_id: "f", rollout_ids: ["r1"] });
    expect(a.kind.statusExtras().retired_sessions).toBe(0);
    expect((await a.post("/ng-rollout/r1-a1/seed_session", {}, cookie)).statusCode).toBe(200);
  });

  /** Holds every seed in its handler until `release()`; its state lives until retireSessionState. */
  function heldSeedServer(mode: CheckpointMode) {
    return class HeldSeed extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = mode;
      readonly states = new Set<string>();
      entered = 0;
      release: () => void = () => undefined;
      private readonly gate = new Promise<void>((resolve) => (this.release = resolve));
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/seed_session", async (request) => {
          this.entered += 1;
          await this.gate;
          this.states.add(sessions.require(request).sessionId);
          return {};
        });
      }
      override async exportSessionStates(ids: string[]): Promise<Record<string, JsonValue>> {
        return Object.fromEntries(ids.filter((id) => this.states.has(id)).map((id) => [id, {}]));
      }
      override async restoreSessionStates(): Promise<void> {}
      override async retireSessionState(sessionId: string): Promise<void> {
        this.states.delete(sessionId);
      }
    };
  }

  it("retire frees the session of a seed that was inside its handler; the seed gets stale_attempt", async () => {
    const Server = heldSeedServer("restart_only");
    const server = new Server();
    const a = await harness(server);
    const seed = a.post("/ng-rollout/r1/seed_session", {});
    await until(() => server.entered === 1, "the seed to start");
    let retired = false;
    const retire = a.call("retire", { checkpoint_id: "r", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }).then(() => (retired = true));
    await until(() => a.kind.readiness().blockers.includes("r1"), "the retire to wait for the seed");
    expect(retired).toBe(false);
    server.release();
    const reply = await seed;
    await retire;
    expect(reply.statusCode).toBe(409);
    expect(reply.json().error.code).toBe("stale_attempt");
    expect(reply.headers["set-cookie"]).toBeUndefined();
    expect(server.states.size).toBe(0);
    expect(a.kind.readiness()).toMatchObject({ blockers: [], restarts: [], counts: { sessions: 0, inflight: 0 } });
  });

  it("a retire whose free of a seed's unbound state fails does not reply retired over that state: it frees it again (or fails, for a retry)", async () => {
    const Server = heldSeedServer("exported");
    const server = new (class extends Server {
      failures = 1;
      override async retireSessionState(sessionId: string): Promise<void> {
        if (this.failures-- > 0) throw new Error("provider: 503 while deleting the sandbox");
        await super.retireSessionState(sessionId);
      }
    })();
    const a = await harness(server);
    const seed = a.post("/ng-rollout/r1/seed_session", {});
    await until(() => server.entered === 1, "the seed to start");
    const retire = a.call("retire", { checkpoint_id: "r", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await until(() => a.kind.readiness().blockers.includes("r1"), "the retire to wait for the seed");
    server.release();
    expect((await seed).json().error.code).toBe("stale_attempt");
    await retire;
    // Retired: its state freed before the reply, not leaked because the first free failed.
    expect({ states: server.states.size, live: a.kind.hasLiveState() }).toEqual({ states: 0, live: false });
  });

  it("a retire lists the sessions again after waiting: one bound meanwhile is freed too", async () => {
    const Server = heldSeedServer("exported");
    const server = new Server();
    const a = await harness(server);
    const seed = a.post("/ng-rollout/r1/seed_session", {});
    await until(() => server.entered === 1, "the seed to start");
    // Straight to the kind: no retired mark, so the seed binds its session while the retire waits.
    const retire = a.kind.retire([{ rollout_id: "r1", attempt: 0 }]);
    server.release();
    expect((await seed).statusCode).toBe(200);
    await retire;
    expect(server.states.size).toBe(0);
    expect(a.kind.readiness()).toMatchObject({ blockers: [], counts: { sessions: 0, inflight: 0 } });
    expect(a.kind.statusExtras().retired_sessions).toBe(1);
  });

  it("a retired attempt's bind leaves a session bound to another attempt alone (not freed, still bound)", async () => {
    const Server = heldSeedServer("exported");
    const server = new Server();
    const a = await harness(server);
    a.kind.bind("s1", { rollout_id: "r1", attempt: 1 });
    server.states.add("s1");
    await a.call("retire", { checkpoint_id: "r", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(() => a.kind.bind("s1", { rollout_id: "r1", attempt: 0 })).toThrow(expect.objectContaining({ code: "stale_attempt" }));
    await a.kind.retire([]); // waits for any free the refused bind started
    expect(server.states.has("s1")).toBe(true);
    expect(a.kind.sessionEpisode("s1")).toEqual({ rollout_id: "r1", attempt: 1 });
  });

  it("a retire whose free failed leaves the session a blocker; forget finishes that free before lifting the fence (it blocked every prepare for good), and fails as long as the free does", async () => {
    const Server = heldSeedServer("exported");
    let failures = 2;
    const server = new (class extends Server {
      override async retireSessionState(sessionId: string): Promise<void> {
        if (failures > 0) {
          failures -= 1;
          throw new Error("free failed");
        }
        await super.retireSessionState(sessionId);
      }
    })();
    const a = await harness(server);
    a.kind.bind("s1", { rollout_id: "r1", attempt: 0 });
    server.states.add("s1");
    await expect(a.kind.retire([{ rollout_id: "r1", attempt: 0 }])).rejects.toThrow("free failed");
    expect(a.kind.readiness().blockers).toEqual(["r1"]);
    await expect(a.kind.forget(["r1"])).rejects.toThrow("free failed");
    // Nothing lifted by the failed forget: the fence holds, the session still a blocker.
    expect(a.kind.statusExtras().retired_sessions).toBe(1);
    expect(a.kind.readiness().blockers).toEqual(["r1"]);
    await a.kind.forget(["r1"]);
    expect(server.states.has("s1")).toBe(false);
    expect(a.kind.readiness().blockers).toEqual([]);
    expect(a.kind.statusExtras().retired_sessions).toBe(0);
  });

  it("explicit started/ended hooks give reset/step protocols a lifecycle", async () => {
    class Gymnasium extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "stateless";
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/reset", async (request) => ({ session: sessions.started(request) }));
        app.post("/step", async (request) => {
          const body = request.body as { done?: boolean };
          if (body.done) sessions.ended(request);
          return { ok: true };
        });
      }
    }
    const a = await harness(new Gymnasium());
    const reset = await a.post("/ng-rollout/g1/reset");
    const cookie = String(reset.headers["set-cookie"]).split(";")[0]!;
    expect(cookie).toBe(`ng_session=${reset.json().session}`);
    expect(reset.headers["x-ng-checkpoint-verify"]).toBe("wait");
    expect(a.kind.readiness().counts.sessions).toBe(1);
    await a.post("/ng-rollout/g1/step", { done: false }, cookie);
    expect(a.kind.readiness().counts.sessions).toBe(1);
    await a.post("/ng-rollout/g1/step", { done: true }, cookie);
    expect(a.kind.readiness().counts.sessions).toBe(0);
  });

  it("a reset refused after sessions.started() starts no session (its cookie is never issued)", async () => {
    class Gymnasium extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "restart_only";
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/reset", async (request) => {
          const session = sessions.started(request); // first, as docs/resources.md asks
          if ((request.body as { seed?: unknown }).seed !== undefined) throw new CheckpointError("invalid_request", "seed is not supported");
          return { session };
        });
      }
    }
    const a = await harness(new Gymnasium());
    const refusedReset = await a.post("/ng-rollout/g1/reset", { seed: 7 });
    expect(refusedReset.statusCode).toBe(400);
    expect(refusedReset.headers["set-cookie"]).toBeUndefined();
    expect(a.kind.readiness()).toMatchObject({ restarts: [], counts: { sessions: 0 } });
    // A started session the same episode already held stays bound when a later reset is refused.
    const reset = await a.post("/ng-rollout/g1/reset");
    const cookie = String(reset.headers["set-cookie"]).split(";")[0]!;
    expect((await a.post("/ng-rollout/g1/reset", { seed: 7 }, cookie)).statusCode).toBe(400);
    expect(a.kind.readiness()).toMatchObject({ restarts: ["g1"], counts: { sessions: 1 } });
    expect(a.kind.sessionEpisode(cookie.split("=")[1]!)).toEqual({ rollout_id: "g1", attempt: 0 });
  });

  it("a reset whose reply is hijacked after sessions.started() starts no session (the SDK issued no cookie)", async () => {
    class Gymnasium extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "restart_only";
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/reset", async (request, reply) => {
          sessions.started(request);
          reply.hijack();
          reply.raw.writeHead(200, { "content-type": "application/json" });
          reply.raw.end("{}");
        });
      }
    }
    const a = await harness(new Gymnasium());
    const reset = await a.post("/ng-rollout/g1/reset");
    expect({ status: reset.statusCode, cookie: reset.headers["set-cookie"] }).toEqual({ status: 200, cookie: undefined });
    // Before: bound for good with no cookie naming it (a restart in every checkpoint).
    await until(() => a.kind.readiness().counts.inflight === 0, "the hijacked reply to be released");
    expect(a.kind.readiness()).toMatchObject({ restarts: [], counts: { sessions: 0, inflight: 0 } });
  });

  it("a callback-style handler that hijacks its reply later is released once that reply is done (prepare is not held for ever)", async () => {
    class Streaming extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "stateless";
      routes(app: FastifyInstance): void {
        // Not async, returns nothing: Fastify waits for reply.send, but the reply is written raw later.
        app.post("/later", (_request, reply) => {
          setImmediate(() => {
            reply.hijack();
            reply.raw.writeHead(200, { "content-type": "application/json" });
            reply.raw.end("{}");
          });
        });
      }
    }
    const a = await harness(new Streaming());
    expect((await a.post("/ng-rollout/r1/later")).statusCode).toBe(200);
    // Before: counted in flight for good, r1 a blocker of every prepare.
    await until(() => a.kind.readiness().counts.inflight === 0, "the hijacked reply to be released", 2000);
    expect((await a.call("prepare", { checkpoint_id: "c1" }, 5)).report).toMatchObject({ ready: true, blockers: [] });
    await a.call("resume", { checkpoint_id: "c1" });
  });

  it("a terminal step refused after sessions.ended() ends nothing: the session stays bound for its retry", async () => {
    class Gymnasium extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "stateless";
      routes(app: FastifyInstance, sessions: SessionAccess): void {
        app.post("/reset", async (request) => ({ session: sessions.started(request) }));
        app.post("/step", async (request) => {
          sessions.ended(request);
          if ((request.body as { action?: unknown }).action !== "stop") throw new CheckpointError("invalid_request", "unknown action");
          return { done: true };
        });
      }
    }
    const a = await harness(new Gymnasium());
    const reset = await a.post("/ng-rollout/g1/reset");
    const cookie = String(reset.headers["set-cookie"]).split(";")[0]!;
    expect((await a.post("/ng-rollout/g1/step", { action: "jump" }, cookie)).statusCode).toBe(400);
    expect(a.kind.sessionEpisode(cookie.split("=")[1]!)).toEqual({ rollout_id: "g1", attempt: 0 });
    await a.call("prepare", { checkpoint_id: "c1" });
    expect((await a.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["g1"]); // still in the checkpoint
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await a.post("/ng-rollout/g1/step", { action: "stop" }, cookie)).statusCode).toBe(200);
    expect(a.kind.readiness().counts.sessions).toBe(0);
  });

  it("export follows the commit scope; restored sessions outside it are freed; a stop commit parks the exported sessions only", async () => {
    const server = new CounterServer();
    const a = await harness(server);
    const c1 = await a.seed("r1");
    await a.seed("r2");
    await a.post("/ng-rollout/r1/increment", {}, c1);
    await a.call("prepare", { checkpoint_id: "c1" });
    const committed = await a.call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }], stop: true });
    expect(committed.episode_ids).toEqual(["r1"]);
    // r2 is outside the scope, so not in the checkpoint: its compute is not parked.
    expect(server.parked).toEqual([[c1.split("=")[1]]]);
    await a.call("resume", { checkpoint_id: "c1" });

    // Restore both into a fresh process, then commit a scope that leaves r2 out.
    await a.call("prepare", { checkpoint_id: "c2" });
    await a.call("commit", { checkpoint_id: "c2" });
    const fresh = new CounterServer();
    const b = await harness(fresh);
    await b.call("restore", { checkpoint_id: "c2", episode_ids: [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 0 }] });
    expect(fresh.counters.size).toBe(2);
    await b.call("resume", { checkpoint_id: "c2" });
    await b.call("prepare", { checkpoint_id: "c3" });
    const scoped = await b.call("commit", { checkpoint_id: "c3", episode_ids: [{ rollout_id: "r1", attempt: 1 }] });
    expect(scoped.episode_ids).toEqual(["r1-a1"]);
    expect(fresh.counters.size).toBe(1);
    expect((await readRecords("c3")).map((r) => [r.episode_id, r.state, r.owner])).toEqual([[{ rollout_id: "r1", attempt: 1 }, { count: 1 }, "worker-0"]]);
  });

  it("a session bound to another attempt is refused with stale_attempt", async () => {
    const a = await harness(new CalculatorServer());
    const cookie = await a.seed("r1-a2");
    expect((await a.post("/ng-rollout/r1-a1/tools/calculator", { expression: "1" }, cookie)).json().error.code).toBe("stale_attempt");
    expect((await a.post("/ng-rollout/r1-a2/tools/calculator", { expression: "1" }, cookie)).json()).toEqual({ result: "1" });
    // A late close from the other attempt does not end the current attempt's session.
    await a.post("/ng-rollout/r1-a1/close_session", {}, cookie);
    expect(a.kind.readiness().counts.sessions).toBe(1);
  });

  it("a late close of another attempt is answered without running its handler", async () => {
    const server = new CounterServer();
    const a = await harness(server);
    const cookie = await a.seed("r1-a2");
    expect((await a.post("/ng-rollout/r1-a2/increment", {}, cookie)).json()).toEqual({ count: 1 });
    const late = await a.post("/ng-rollout/r1-a1/close_session", {}, cookie);
    expect(late.statusCode).toBe(200);
    expect(late.json()).toEqual({});
    expect(server.counters.get(cookie.split("=")[1]!)).toBe(1);
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1, inflight: 0 });
    expect((await a.post("/ng-rollout/r1-a2/increment", {}, cookie)).json()).toEqual({ count: 2 });
  });

  it("a prefix whose capture key does not decode is invalid_request, not an internal error", async () => {
    const a = await harness(new CalculatorServer());
    const reply = await a.post("/ng-rollout/%E0/seed_session", { task: { expression: "1" } });
    expect(reply.statusCode).toBe(400);
    expect(reply.json().error.code).toBe("invalid_request");
  });

  it("an exported server must implement its hooks", async () => {
    class Incomplete extends ResourcesServer {
      static override readonly checkpointMode: CheckpointMode = "exported";
      routes(): void {}
    }
    await expect(createResourcesApp(new Incomplete())).rejects.toThrow(/requires the exportSessionStates hook/);
  });

  it("an owner no record may carry is refused when the app is built, not by every commit", async () => {
    for (const owner of ["", "w".repeat(201)]) {
      await expect(createResourcesApp(new CalculatorServer(), { owner }), owner).rejects.toThrow(/owner .* must be 1-200 characters/);
    }
    const a = await harness(new CalculatorServer());
    await a.seed("r1");
    await a.call("prepare", { checkpoint_id: "c1" });
    expect((await a.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["r1"]);
  });
});

export type { ResourcesKind };
