import { afterEach, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { deferred } from "../../support/deferred.js";
import { refusalCode } from "../../support/refusal.js";

/**
 * A retire cut short by its deadline while the retired attempt's turn loop still runs (an
 * activation, or a legacy `/run`, slow to stop on its signal) answers deadline_exceeded. A forget
 * of the rollout must not lift the fences while that loop still runs: forget goes callers before
 * callees, so the model and resources then lift theirs too, and the loop's late calls for the
 * forgotten attempt would be served. It waits for the loop as retire does (bounded by its deadline).
 */

const T0 = 1_700_000_000;
const planes: ParticipantControlPlane[] = [];
afterEach(() => {
  for (const plane of planes.splice(0)) plane.dispose();
});

function world() {
  const clock = new ManualClock(T0 * 1000);
  const frees: string[] = [];
  const kind = new AgentKind(
    {
      exportAgentSessions: async (keys) => Object.fromEntries(keys.map((key) => [key, null])),
      restoreAgentSessions: async () => undefined,
      retireAgentSession: async (key) => void frees.push(key),
    },
    clock,
  );
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "agent0", clock });
  planes.push(plane);
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) =>
    plane.handle(op, { deadline_ts: T0 + 10, epoch: 1, ...body } as never);
  return { clock, frees, kind, plane, call };
}

const flush = async () => {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
};

/** Retires r1-a0 while `loop` holds its turn loop; the retire answers deadline_exceeded. */
async function retireCutShort(w: ReturnType<typeof world>): Promise<void> {
  const retire = refusalCode(w.call("retire", { checkpoint_id: "retire", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
  await flush();
  w.clock.advance(10_000);
  expect(await retire).toBe("deadline_exceeded");
}

it("a forget after a retire cut short waits for the retired session's activation still running, then frees the session and lifts the fence", async () => {
  const w = world();
  const r1 = { rollout_id: "r1", attempt: 0 };
  const loop = deferred();
  w.kind.openSession(r1);
  const activation = w.kind.activate(r1, () => loop.promise); // ignores its signal for now
  await flush();
  await retireCutShort(w);

  let answered = false;
  const forget = w.call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 60, rollout_ids: ["r1"] }).finally(() => void (answered = true));
  await flush();
  expect({ answered, fenced: w.plane.isRetired(r1) }).toEqual({ answered: false, fenced: true });

  loop.resolve();
  await activation;
  expect(await forget).toEqual({ forgotten: ["r1"] });
  expect({ frees: w.frees, fenced: w.plane.isRetired(r1), live: w.kind.hasLiveState() }).toEqual({ frees: ["r1"], fenced: false, live: false });
});

it("a forget after a retire cut short waits for the retired legacy /run still running", async () => {
  const w = world();
  const r1 = { rollout_id: "r1", attempt: 0 };
  const loop = deferred();
  const run = w.kind.runLegacy(r1, { task: 1 }, {}, () => loop.promise).catch(() => undefined);
  await flush();
  await retireCutShort(w);

  let answered = false;
  const forget = w.call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 60, rollout_ids: ["r1"] }).finally(() => void (answered = true));
  await flush();
  expect({ answered, fenced: w.plane.isRetired(r1) }).toEqual({ answered: false, fenced: true });

  loop.resolve();
  await run;
  expect(await forget).toEqual({ forgotten: ["r1"] });
  expect({ fenced: w.plane.isRetired(r1), live: w.kind.hasLiveState() }).toEqual({ fenced: false, live: false });
});

it("a forget whose wait for such an activation outlives its deadline answers deadline_exceeded and lifts no fence", async () => {
  const w = world();
  const r1 = { rollout_id: "r1", attempt: 0 };
  const loop = deferred();
  w.kind.openSession(r1);
  const activation = w.kind.activate(r1, () => loop.promise);
  await flush();
  await retireCutShort(w);

  const forget = refusalCode(w.call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 20, rollout_ids: ["r1"] }));
  await flush();
  w.clock.advance(10_000);
  expect(await forget).toBe("deadline_exceeded");
  expect({ fenced: w.plane.isRetired(r1), blockers: w.kind.readiness().blockers }).toEqual({ fenced: true, blockers: ["r1"] });
  loop.resolve();
  await activation;
});
