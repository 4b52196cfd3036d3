import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "./fake-participants.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-clock-step-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("publication order within one epoch", () => {
  it("a wall clock stepped back between publications still orders the newer checkpoint last: retention keeps it and LATEST's predecessor", async () => {
    const { engine, clock, catalog } = makeEngine(root, { retention: 2 });
    const checkpoint = (id: string) => engine.checkpoint({ checkpoint_id: id, episode_ids: null, stop: false, controller_state: null });
    await checkpoint("c1");
    clock.current += 60_000;
    await checkpoint("c2");
    // An NTP step (or a VM resumed) puts the wall clock two minutes back, before c1's publication.
    clock.current -= 120_000;
    const c3 = await checkpoint("c3");
    clock.current += 1_000;
    const c4 = await checkpoint("c4");
    // Retention kept the newest two by publication: c4 (LATEST) and c3, the one to fall back to.
    expect([c3.deleted, c4.deleted]).toEqual([["c1"], ["c2"]]);
    expect(catalog.scan().published.map((e) => e.checkpoint_id)).toEqual(["c4", "c3"]);
    expect(await catalog.latest()).toBe("c4");
  });

  it("a decision journaled after a step back is not taken for one a publication of its epoch overtook: a successor completes it", async () => {
    let crash = false;
    const first = makeEngine(root, { hooks: { afterDecision: async () => {
          if (crash) throw new Error("crash after decision");
        }, } });
    await first.engine.checkpoint({ checkpoint_id: "c1", episode_ids: null, stop: false, controller_state: null });
    first.clock.current -= 120_000;
    crash = true;
    await first.engine.prepare({ checkpoint_id: "c2" });
    await expect(first.engine.commit({ checkpoint_id: "c2", episode_ids: null, stop: false })).rejects.toThrow("crash after decision");
    const entry = first.journal.entries.get("c2")!;
    expect(entry.state).toBe("decided");
    // A successor of the next epoch, over the same checkpoint root, recovers that decision.
    const second = makeEngine(root, { epoch: 8 });
    await second.journal.record({ ...entry, auto_publish: true });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "c2", action: "committed_published_resumed" }]);
    expect(await second.catalog.latest()).toBe("c2");
  });
});
