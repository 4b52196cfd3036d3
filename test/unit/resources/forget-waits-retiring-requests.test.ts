import { afterEach, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ResourcesKind } from "../../../participants/kinds/resources/index.js";
import { refusalCode } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * A retire cut short by its deadline while a request of the retired session still runs (a handler
 * slow to stop) answers deadline_exceeded and leaves the session retiring. A forget of its rollout
 * must not free that session and lift the fences while the request still runs: whatever the handler
 * writes afterwards would outlive the free, unfenced, until the original retire ended. It waits
 * for those requests as retire does (bounded by its own deadline), then frees.
 */

const T0 = 1_700_000_000;
const planes: ParticipantControlPlane[] = [];
afterEach(() => {
  for (const plane of planes.splice(0)) plane.dispose();
});

function world() {
  const clock = new ManualClock(T0 * 1000);
  const frees: string[] = [];
  const kind = new ResourcesKind({
    mode: "exported",
    verify: "wait",
    clock,
    hooks: {
      exportSessionStates: async () => ({}),
      restoreSessionStates: async () => undefined,
      retireSessionState: async (sessionId) => void frees.push(sessionId),
    },
  });
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "res0", clock });
  planes.push(plane);
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) =>
    plane.handle(op, { deadline_ts: T0 + 10, epoch: 1, ...body } as never);
  return { clock, frees, kind, plane, call };
}

const flush = async () => {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
};

it("a forget after a retire cut short waits for the retired session's request still running before it frees the session and lifts the fence", async () => {
  const { clock, frees, kind, plane, call } = world();
  const r1 = { rollout_id: "r1", attempt: 0 };
  kind.bind("session-1", r1);
  const ticket = await kind.admit({ episode: r1, sessionId: "session-1", role: "other" });
  kind.enter(ticket);

  const retire = refusalCode(call("retire", { checkpoint_id: "retire", episode_ids: [r1] }));
  await flush();
  clock.advance(10_000);
  expect(await retire).toBe("deadline_exceeded"); // the request still runs: nothing freed yet
  expect(ticket.signal.aborted).toBe(true);

  let answered = false;
  const forget = call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 60, rollout_ids: ["r1"] }).finally(() => void (answered = true));
  await flush();
  expect({ answered, frees, fenced: plane.isRetired(r1) }).toEqual({ answered: false, frees: [], fenced: true });

  kind.release(ticket); // the handler stops
  expect(await forget).toEqual({ forgotten: ["r1"] });
  await waitUntil(() => frees.length >= 1, "the session's free");
  expect({ first: frees[0], fenced: plane.isRetired(r1), live: kind.hasLiveState() }).toEqual({ first: "session-1", fenced: false, live: false });
});

it("a forget whose wait for such a request outlives its deadline answers deadline_exceeded, freeing nothing and lifting no fence", async () => {
  const { clock, frees, kind, plane, call } = world();
  const r1 = { rollout_id: "r1", attempt: 0 };
  kind.bind("session-1", r1);
  const ticket = await kind.admit({ episode: r1, sessionId: "session-1", role: "other" });
  kind.enter(ticket);

  const retire = refusalCode(call("retire", { checkpoint_id: "retire", episode_ids: [r1] }));
  await flush();
  clock.advance(10_000);
  expect(await retire).toBe("deadline_exceeded");

  const forget = refusalCode(call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 20, rollout_ids: ["r1"] }));
  await flush();
  clock.advance(10_000);
  expect(await forget).toBe("deadline_exceeded");
  expect({ frees, fenced: plane.isRetired(r1), blockers: kind.readiness().blockers }).toEqual({ frees: [], fenced: true, blockers: ["r1"] });
  kind.release(ticket);
});
