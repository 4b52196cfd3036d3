import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { AgentKind, type Activation } from "../../../participants/kinds/agent/index.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { ep } from "../../support/episode.js";

/**
 * An environment's replay step opens its agent session, then activates it. The environment (a
 * replay step does not block it) and the agent may prepare between the two calls: the session is
 * idle, exported at its snapshot. An activation arriving then must not start its turn loop (a
 * loop doing anything before its first boundary, such as listing its tools, is between
 * boundaries: the commit would refuse, readiness regressed), as an environment step does not
 * start while a checkpoint is open: it waits at the session's boundary for resume.
 */
let root: string;
const planes: ParticipantControlPlane[] = [];
beforeEach(async () => (root = await mkdtemp(join(tmpdir(), "gym-ckpt-activate-"))));
afterEach(async () => {
  for (const plane of planes.splice(0)) plane.dispose();
  await rm(root, { recursive: true, force: true });
});

function fresh() {
  const kind = new AgentKind();
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "agent0", leaseGraceSeconds: 60, checkpointRoot: root });
  planes.push(plane as unknown as ParticipantControlPlane);
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) => {
    const request: Record<string, unknown> = { deadline_ts: Date.now() / 1000 + 30, epoch: 1, ...body };
    if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
    if (op === "commit" && !("checkpoint_dir" in body)) createCheckpointDir(root, body.checkpoint_id);
    return plane.handle(op, request as never);
  };
  return { kind, call };
}

describe("an activation of an idle session while the agent is prepared", () => {
  it("waits at the session's boundary until resume, so the commit exports the session instead of refusing", async () => {
    const { kind, call } = fresh();
    kind.openSession(ep("a"));
    expect((await call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
    const started: string[] = [];
    let tools!: () => void;
    const run = kind.activate(ep("a"), async (activation: Activation) => {
      started.push("loop");
      // Work before the first boundary (a tool listing, a state load): between boundaries.
      await new Promise<void>((resolve) => (tools = resolve));
      await activation.boundary(() => ({ messages: ["S0"] }));
      return "done";
    });
    expect(kind.readiness().blockers).toEqual([]);
    const committed = await call("commit", { checkpoint_id: "c1" });
    expect(committed.episode_ids).toEqual(["a"]);
    expect(started).toEqual([]);
    await call("resume", { checkpoint_id: "c1" });
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(started).toEqual(["loop"]);
    tools();
    expect(await run).toBe("done");
  });
});
