import { afterEach, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ResourcesKind } from "../../../participants/kinds/resources/index.js";
import { deferred } from "../../support/deferred.js";
import { refusalCode } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * A retire whose free of a session outlives its deadline answers deadline_exceeded and frees the
 * lock while the kind's retire runs on. The coordinator sends the retire again: that retry must not
 * start a second free of the same session's state beside the first (a sandbox deleted twice at once,
 * whose second delete fails and fails the retry), but wait for the one under way.
 */

const T0 = 1_700_000_000;
const planes: ParticipantControlPlane[] = [];
afterEach(() => {
  for (const plane of planes.splice(0)) plane.dispose();
});

it("a retire retried while the first one's free of the session still runs starts no second free of it, and answers once that free ended", async () => {
  const clock = new ManualClock(T0 * 1000);
  const freeing = deferred();
  const frees: string[] = [];
  let running = 0;
  let overlapped = false;
  const kind = new ResourcesKind({
    mode: "exported",
    verify: "wait",
    hooks: {
      exportSessionStates: async () => ({}),
      restoreSessionStates: async () => undefined,
      retireSessionState: async (sessionId) => {
        frees.push(sessionId);
        if (running > 0) overlapped = true;
        running += 1;
        try {
          await freeing.promise;
        } finally {
          running -= 1;
        }
      },
    },
  });
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "res0", clock });
  planes.push(plane);
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) =>
    plane.handle(op, { deadline_ts: T0 + 10, epoch: 1, ...body } as never);
  const r1 = { rollout_id: "r1", attempt: 0 };
  kind.bind("session-1", r1);

  const first = refusalCode(call("retire", { checkpoint_id: "retire", episode_ids: [r1] }));
  await waitUntil(() => frees.length === 1, "the first free to start");
  clock.advance(10_000);
  expect(await first).toBe("deadline_exceeded");

  const retry = call("retire", { checkpoint_id: "retire", deadline_ts: T0 + 60, episode_ids: [r1] });
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
  expect(frees).toEqual(["session-1"]); // no second free beside the running one
  freeing.resolve();
  expect(await retry).toEqual({ retired: ["r1"] });
  expect(overlapped).toBe(false);
  expect(kind.hasLiveState()).toBe(false);
  expect(kind.readiness().blockers).toEqual([]);
});
