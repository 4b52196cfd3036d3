import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { FastifyInstance } from "fastify";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { createResourcesApp, type CheckpointVerify, type ResourcesAppOptions, type ResourcesServer, type SessionAccess } from "../../../participants/kinds/resources/index.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";

/** A resources app plus its control plane, in process (the shape of resources-participant.test.ts). */
export async function resourcesWorld() {
  const root = await mkdtemp(join(tmpdir(), "gym-ckpt-res-"));
  const opened: { app: FastifyInstance; plane: ParticipantControlPlane<any> }[] = [];
  const harness = async (server: ResourcesServer, owner = "worker-0", options: ResourcesAppOptions = {}) => {
    const clock = new ManualClock();
    const { app, kind } = await createResourcesApp(server, { owner, clock, ...options });
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
    const post = (url: string, payload: object = {}, cookie?: string) => app.inject({ method: "POST", url, payload, ...(cookie ? { headers: { cookie } } : {}) });
    return { app, kind, plane, call, post, clock };
  };
  const writeCheckpoint = (id: string, records: object[]) =>
    new FsCheckpointStorage().write({ checkpointDir: join(root, id), checkpointId: id, kind: "resources", instance: "res0" }, records as never, {
      gate: new WriteGate(),
      createdAt: Date.now() / 1000,
      extra: {},
    });
  const close = async () => {
    for (const { app, plane } of opened.splice(0)) {
      plane.dispose();
      await app.close();
    }
    await rm(root, { recursive: true, force: true });
  };
  return { root, harness, writeCheckpoint, close };
}

export const counterRecord = (rollout: string, session: string, count: number) => ({
  episode_id: { rollout_id: rollout, attempt: 0 },
  session_id: session,
  state: { count },
  owner: null,
});

/** An exported counter whose verify only reads the count, so it may run again (replayable). */
export class ReplayCounter extends CounterServer {
  static override readonly checkpointVerify: CheckpointVerify = "replay";
  override routes(app: FastifyInstance, sessions: SessionAccess): void {
    app.post("/seed_session", async (request) => (await this.seed(sessions.require(request).sessionId), {}));
    app.post("/increment", async (request) => {
      const { sessionId } = sessions.require(request);
      const count = (this.counters.get(sessionId) ?? 0) + 1;
      this.counters.set(sessionId, count);
      return { count };
    });
    app.post("/verify", async (request) => {
      const { expected } = request.body as { expected: number };
      const count = this.counters.get(sessions.require(request).sessionId) ?? 0;
      return { reward: count === expected ? 1 : 0, count };
    });
    app.post("/close_session", async () => ({})); // the SDK frees the state as the session ends
  }
  /** A seed's work on its session's state (a test may make it wait inside the handler). */
  protected async seed(sessionId: string): Promise<void> {
    this.counters.set(sessionId, 0);
  }
}
