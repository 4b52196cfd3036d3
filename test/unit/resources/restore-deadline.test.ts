import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { JsonValue } from "../../../participants/kinds/resources/index.js";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { refusalCode } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";
import { counterRecord, resourcesWorld } from "./resources-world.js";

let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

const settleWithin = <T>(work: Promise<T>, ms: number): Promise<T | "still running"> =>
  Promise.race([work, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), ms).unref())]);

describe("a restore hook and the restore's deadline", () => {
  it("a hook that never settles: the restore answers by its deadline and nothing queues behind it for good", async () => {
    class HangingRestore extends CounterServer {
      override restoreSessionStates(): Promise<void> {
        return new Promise(() => undefined);
      }
    }
    const record = counterRecord("r1", "sessionAAAA", 2);
    await world.writeCheckpoint("c1", [record]);
    const b = await world.harness(new HangingRestore());
    const restore = refusalCode(b.call("restore", { checkpoint_id: "c1", episode_ids: [record.episode_id] }, 0.5));
    expect(await settleWithin(restore, 5_000)).toBe("deadline_exceeded");
    // The coordinator's clean-up (retire attempt+1, resume) is answered, not queued behind the hook.
    expect(await settleWithin(b.call("retire", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 1 }] }, 2).then(() => "answered"), 5_000)).toBe("answered");
    expect(await settleWithin(b.call("resume", { checkpoint_id: "c1" }, 2).then(() => "answered"), 5_000)).toBe("answered");
    // Admission is open for everything else; attempt+1 is fenced.
    expect(await settleWithin(b.post("/ng-rollout/r7/seed_session", {}).then((reply) => reply.statusCode), 5_000)).toBe(200);
    expect((await b.post("/ng-rollout/r1-a1/increment", {}, "ng_session=sessionAAAA")).statusCode).toBe(409);
  }, 20_000);

  it("a hook that ends after the deadline: what it installed is never served and is freed once it ends", async () => {
    let ended = false;
    class SlowRestore extends CounterServer {
      override async restoreSessionStates(states: Record<string, JsonValue>): Promise<void> {
        await new Promise((resolve) => setTimeout(resolve, 600));
        await super.restoreSessionStates(states);
        ended = true;
      }
    }
    const record = counterRecord("r1", "sessionAAAA", 2);
    await world.writeCheckpoint("c1", [record]);
    const b = await world.harness(new SlowRestore());
    expect(await refusalCode(b.call("restore", { checkpoint_id: "c1", episode_ids: [record.episode_id] }, 0.2))).toBe("deadline_exceeded");
    expect(b.plane.currentPhase).toBe("idle");
    await waitUntil(() => ended, "the slow hook to end", 5_000);
    // Freed once the hook ended: no live state (a restore of fresh records could run here again).
    await waitUntil(() => !b.kind.hasLiveState(), "the late install to be freed", 5_000);
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 0, restored: 0 });
    // The replacement attempt is refused, never served from the state of a restore that failed.
    const next = await b.post("/ng-rollout/r1-a1/increment", {}, "ng_session=sessionAAAA");
    expect(next.statusCode).toBe(409);
    expect(next.json()).toMatchObject({ error: { code: "stale_attempt" } });
  }, 20_000);
});
