import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { counterRecord, resourcesWorld } from "./resources-world.js";

/**
 * A retire arriving right after the resume, while the commit's after-commit hook still frees a
 * restored session the commit left out, of the retired attempt: retire replies once its state is
 * freed (protocol.md: "frees its state, then replies"), not while that free still runs.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

class HeldFree extends CounterServer {
  release!: () => void;
  private readonly held = new Promise<void>((resolve) => (this.release = resolve));
  override async retireSessionState(sessionId: string): Promise<void> {
    await this.held;
    await super.retireSessionState(sessionId);
  }
}

describe("a retire racing the after-commit free of a restored session of its attempt", () => {
  it("replies only once that session's state is freed", async () => {
    const server = new HeldFree();
    const r2 = counterRecord("r2", "sessionBBBB", 5);
    await world.writeCheckpoint("c1", [r2]);
    const b = await world.harness(server);
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [r2.episode_id] });
    await b.call("resume", { checkpoint_id: "c1" });
    await b.call("prepare", { checkpoint_id: "c2" });
    // c2 continues nothing: r2-a1's restored session is freed in the background (held).
    await b.call("commit", { checkpoint_id: "c2", episode_ids: [] }, 0.3);
    await b.call("resume", { checkpoint_id: "c2" });
    const retire = b.call("retire", { checkpoint_id: "x1", episode_ids: [{ rollout_id: "r2", attempt: 1 }] }).then(() => server.counters.has("sessionBBBB"));
    await new Promise((resolve) => setTimeout(resolve, 50));
    server.release();
    expect(await retire).toBe(false); // freed before the reply
  });
});
