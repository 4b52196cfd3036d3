import { afterEach, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/environment-kind.js";
import { deferred } from "../../support/deferred.js";
import { refusalCode } from "../../support/refusal.js";

/**
 * A retire cut short by its deadline while the retired episode still runs (episode code slow to
 * stop on its signal) answers deadline_exceeded. The protocol lifts the fence only once nothing of
 * the attempt can still run: a forget of the rollout waits for that episode (bounded by its own
 * deadline), or the callees' forgets after it (agent, model, resources) would admit its late calls.
 */

const T0 = 1_700_000_000;
const planes: ParticipantControlPlane[] = [];
afterEach(() => {
  for (const plane of planes.splice(0)) plane.dispose();
});

const flush = async () => {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
};

it("a forget after a retire cut short waits for the retired episode still running before it lifts the fence", async () => {
  const clock = new ManualClock(T0 * 1000);
  const kind = new EnvironmentKind(clock);
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock });
  planes.push(plane);
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) =>
    plane.handle(op, { deadline_ts: T0 + 10, epoch: 1, ...body } as never);
  const r1 = { rollout_id: "r1", attempt: 0 };
  const episode = deferred();
  const run = kind.begin(r1, { task: 1 }, {}, () => episode.promise).catch(() => undefined); // ignores its signal
  await flush();

  const retire = refusalCode(call("retire", { checkpoint_id: "retire", episode_ids: [r1] }));
  await flush();
  clock.advance(10_000);
  expect(await retire).toBe("deadline_exceeded");

  let answered = false;
  const forget = call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 60, rollout_ids: ["r1"] }).finally(() => void (answered = true));
  await flush();
  expect({ answered, fenced: plane.isRetired(r1) }).toEqual({ answered: false, fenced: true });

  episode.resolve();
  await run;
  expect(await forget).toEqual({ forgotten: ["r1"] });
  expect({ fenced: plane.isRetired(r1), live: kind.hasLiveState() }).toEqual({ fenced: false, live: false });
});
