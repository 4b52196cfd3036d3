import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { waitUntil } from "../../support/wait-until.js";
import { counterRecord, resourcesWorld } from "./resources-world.js";

/**
 * ResourcesKind.afterCommit frees the unclaimed restored sessions outside the commit scope. The
 * commit replies by its deadline even if that free is slow, so after the resume a request of the
 * next attempt can arrive while it runs: it must not be served from a session whose state is then
 * freed behind its back (the agent and model kinds drop everything before their first await too).
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

/** A server whose frees wait for `release()`. */
class HeldFree extends CounterServer {
  release!: () => void;
  private readonly held = new Promise<void>((resolve) => (this.release = resolve));
  override async retireSessionState(sessionId: string): Promise<void> {
    await this.held;
    await super.retireSessionState(sessionId);
  }
}

/** A harness over `server` that restored `records` from checkpoint c1 and resumed it: each session lives on as attempt 1. */
async function restoredFromC1(server: CounterServer, records: ReturnType<typeof counterRecord>[]) {
  await world.writeCheckpoint("c1", records);
  const b = await world.harness(server);
  await b.call("restore", { checkpoint_id: "c1", episode_ids: records.map((r) => r.episode_id) });
  await b.call("resume", { checkpoint_id: "c1" });
  return b;
}

describe("after-commit clean-up of unclaimed restored sessions", () => {
  it("never frees a session its next attempt claimed while the clean-up ran", async () => {
    const server = new HeldFree();
    const r1 = counterRecord("r1", "sessionAAAA", 2);
    const r2 = counterRecord("r2", "sessionBBBB", 5);
    const b = await restoredFromC1(server, [r1, r2]);

    await b.call("prepare", { checkpoint_id: "c2" });
    // The scope continues r1-a1 only: r2-a1's unclaimed session is freed in the background (the
    // commit replies by its deadline while the free is held).
    await b.call("commit", { checkpoint_id: "c2", episode_ids: [{ rollout_id: "r1", attempt: 1 }] }, 1);
    await b.call("resume", { checkpoint_id: "c2" });
    // r2-a1 starts meanwhile (the rollout may still run as that attempt) and uses its session.
    const claimed = await b.post("/ng-rollout/r2-a1/increment", {}, "ng_session=sessionBBBB");
    server.release();
    await waitUntil(() => !server.counters.has("sessionBBBB"), "r2-a1's session to be freed");
    const after = await b.post("/ng-rollout/r2-a1/increment", {}, "ng_session=sessionBBBB");
    // Either the session was gone before anyone could use it, or what its user wrote survives:
    // never a request served from the session and then its state freed behind its back.
    if (claimed.statusCode === 200 && after.statusCode === 200) expect(after.json().count).toBe(claimed.json().count + 1);
    // Here: refused while its free runs (retry later); once it ended the session is unknown (a new count).
    expect(claimed.json().error?.code).toBe("admission_closed");
    expect(after.json()).toEqual({ count: 1 });
    expect(server.counters.get("sessionAAAA")).toBe(2); // r1-a1's session lives on
  });

  it("a seed that waited through the checkpoint with the cookie of a session the clean-up frees is not freed behind its back", async () => {
    const server = new HeldFree();
    const r2 = counterRecord("r2", "sessionBBBB", 5);
    const b = await restoredFromC1(server, [r2]);
    await b.call("prepare", { checkpoint_id: "c2" });
    // r2-a1 seeds again with its restored cookie while c2 is open: it waits for resume.
    const seed = b.post("/ng-rollout/r2-a1/seed_session", {}, "ng_session=sessionBBBB");
    await waitUntil(() => b.kind.readiness().counts.waiting === 1, "the seed to wait for resume");
    // c2 continues nothing: the unclaimed restored session is freed in the background (held).
    await b.call("commit", { checkpoint_id: "c2", episode_ids: [] }, 1);
    await b.call("resume", { checkpoint_id: "c2" });
    const seeded = await seed;
    server.release();
    // The free ran (the restored count 5 is gone); it must not have taken what the seed built.
    await waitUntil(() => server.counters.get("sessionBBBB") !== 5, "the seed to take the session up");
    if (seeded.statusCode === 200) expect(server.counters.get("sessionBBBB")).toBe(0);
    // Refused while the free ran; once it ended the retried seed gets a session of its own.
    expect(seeded.json().error?.code).toBe("admission_closed");
    const again = await b.post("/ng-rollout/r2-a1/seed_session", {}, "ng_session=sessionBBBB");
    expect(again.statusCode).toBe(200);
    const cookie = String(again.headers["set-cookie"]).split(";")[0]!;
    expect(server.counters.get(cookie.split("=")[1]!)).toBe(0);
  }, 15_000);

  it("a session still being freed is live state until its free ended (a restore must not install it under the free)", async () => {
    const r2 = counterRecord("r2", "sessionBBBB", 5);
    const server = new HeldFree();
    const b = await restoredFromC1(server, [r2]);
    await b.call("prepare", { checkpoint_id: "c2" });
    await b.call("commit", { checkpoint_id: "c2", episode_ids: [] }, 1);
    await b.call("resume", { checkpoint_id: "c2" });
    // The free of sessionBBBB still runs: installing it again now would be freed behind its back.
    expect(b.kind.hasLiveState()).toBe(true);
    server.release();
    await waitUntil(() => !b.kind.hasLiveState(), "every restored session to be freed");
    expect(server.counters.has("sessionBBBB")).toBe(false);
  }, 15_000);

  it("a session whose free fails stays refused and held, and the next commit's clean-up (or a forget of its rollout) frees it", async () => {
    class FailingFree extends CounterServer {
      failures = 0;
      override async retireSessionState(sessionId: string): Promise<void> {
        if (this.failures > 0) {
          this.failures -= 1;
          throw new Error("sandbox did not stop");
        }
        await super.retireSessionState(sessionId);
      }
    }
    const r1 = counterRecord("r1", "sessionAAAA", 2);
    const r2 = counterRecord("r2", "sessionBBBB", 5);
    const server = new FailingFree();
    const b = await restoredFromC1(server, [r1, r2]);
    // c2 continues neither: both frees fail the first time.
    server.failures = 2;
    await b.call("prepare", { checkpoint_id: "c2" });
    await b.call("commit", { checkpoint_id: "c2", episode_ids: [] });
    await b.call("resume", { checkpoint_id: "c2" });
    await waitUntil(() => server.failures === 0, "both failing frees to be tried");
    // Not served from state nobody tracks any more: refused, and still live state here.
    expect((await b.post("/ng-rollout/r2-a1/increment", {}, "ng_session=sessionBBBB")).json().error?.code).toBe("admission_closed");
    expect(b.kind.hasLiveState()).toBe(true);
    // A forget of r1 frees its session at once; the next commit's clean-up frees r2's.
    await b.call("forget", { checkpoint_id: "forget", rollout_ids: ["r1"] });
    expect(server.counters.has("sessionAAAA")).toBe(false);
    expect(server.counters.get("sessionBBBB")).toBe(5);
    await b.call("prepare", { checkpoint_id: "c3" });
    await b.call("commit", { checkpoint_id: "c3", episode_ids: [] });
    await b.call("resume", { checkpoint_id: "c3" });
    await waitUntil(() => !b.kind.hasLiveState(), "every restored session to be freed");
    expect(server.counters.has("sessionBBBB")).toBe(false);
    expect((await b.post("/ng-rollout/r2-a1/increment", {}, "ng_session=sessionBBBB")).json()).toEqual({ count: 1 });
  }, 15_000);

  it("a stop commit whose clean-up outlived it parks the sessions it exported, not a later commit's", async () => {
    const r1 = counterRecord("r1", "sessionAAAA", 2);
    const r2 = counterRecord("r2", "sessionBBBB", 5);
    // The held free ends while the later commit exports (before that commit's own clean-up).
    class ReleasedByExport extends HeldFree {
      releaseOnExport = false;
      override async exportSessionStates(sessionIds: string[]) {
        if (this.releaseOnExport) this.release();
        return super.exportSessionStates(sessionIds);
      }
    }
    const server = new ReleasedByExport();
    const b = await restoredFromC1(server, [r1, r2]);
    expect((await b.post("/ng-rollout/r1-a1/increment", {}, "ng_session=sessionAAAA")).json()).toEqual({ count: 3 });
    // A stop commit continuing r1-a1 only: r2-a1's unclaimed session is freed past its deadline.
    await b.call("prepare", { checkpoint_id: "c2" });
    await b.call("commit", { checkpoint_id: "c2", episode_ids: [{ rollout_id: "r1", attempt: 1 }], stop: true }, 1);
    await b.call("resume", { checkpoint_id: "c2" }); // the Gym did not exit: its lease, or the controller
    const seeded = await b.post("/ng-rollout/r3/seed_session");
    const r3Session = String(seeded.headers["set-cookie"]).split(";")[0]!.split("=")[1]!;
    server.releaseOnExport = true;
    await b.call("prepare", { checkpoint_id: "c3" });
    await b.call("commit", { checkpoint_id: "c3" }); // no stop: nothing of it is parked
    await waitUntil(() => !server.counters.has("sessionBBBB"), "r2-a1's session to be freed"); // c2's clean-up freed it; its park follows
    await new Promise((resolve) => setImmediate(resolve));
    expect(server.parked).toEqual([["sessionAAAA"]]);
    expect(server.counters.has(r3Session)).toBe(true);
  }, 15_000);
});

/**
 * A retire arriving right after the resume, while the commit's after-commit hook still frees a
 * restored session the commit left out, of the retired attempt: retire replies once its state is
 * freed (protocol.md: "frees its state, then replies"), not while that free still runs.
 */
describe("a retire racing the after-commit free of a restored session of its attempt", () => {
  it("replies only once that session's state is freed", async () => {
    const server = new HeldFree();
    const r2 = counterRecord("r2", "sessionBBBB", 5);
    const b = await restoredFromC1(server, [r2]);
    await b.call("prepare", { checkpoint_id: "c2" });
    // c2 continues nothing: r2-a1's restored session is freed in the background (held).
    await b.call("commit", { checkpoint_id: "c2", episode_ids: [] }, 1);
    await b.call("resume", { checkpoint_id: "c2" });
    const retire = b.call("retire", { checkpoint_id: "x1", episode_ids: [{ rollout_id: "r2", attempt: 1 }] }).then(() => server.counters.has("sessionBBBB"));
    // Not for correctness: a retire that replied without waiting gets its chance to do so first
    // (the right one answers false however long this is).
    await new Promise((resolve) => setTimeout(resolve, 50));
    server.release();
    expect(await retire).toBe(false); // freed before the reply
  });
});
