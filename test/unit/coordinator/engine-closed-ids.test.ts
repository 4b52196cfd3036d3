import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { REMEMBERED_CLOSED } from "../../../coordinator/engine/checkpoint-engine.js";
import { makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-closed-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("closed checkpoint ids", () => {
  it("a long-lived leader keeps the most recent closed ids only: memory stays bounded however many checkpoints it ran", { timeout: 60_000 }, async () => {
    const { engine } = makeEngine(root, { members: [{ kind: "environment", instance: "e1" }] });
    const closed = (engine as unknown as { closed: Set<string> }).closed;
    const total = REMEMBERED_CLOSED + 50;
    for (let i = 0; i < total; i++) {
      await engine.prepare({ checkpoint_id: `c${i}` });
      await engine.resume({ checkpoint_id: `c${i}` });
    }
    expect(closed.size).toBeLessThanOrEqual(REMEMBERED_CLOSED);
    // The recent ones are still known: a resume retried is idempotent, a prepare of one refused.
    expect(await engine.resume({ checkpoint_id: `c${total - 1}` })).toEqual({ checkpoint_id: `c${total - 1}`, participants: [] });
    expect((await refusalOf(engine.prepare({ checkpoint_id: `c${total - 1}` }))).code).toBe("stale_checkpoint");
  });

  it("a failed restore's restore_failed is forgotten with its closed id: one per failed restore for the life of the process would grow without bound", { timeout: 60_000 }, async () => {
    const { engine, fake } = makeEngine(root, { members: [{ kind: "environment", instance: "e1" }] });
    const failures = (engine as unknown as { restoreFailures: Map<string, string> }).restoreFailures;
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    fake.set("environment", "e1", "restore", { error: "deadline_exceeded" });
    expect((await refusalOf(engine.restore({ checkpoint_id: "base", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).code).toBe("restore_failed");
    expect(failures.has("base")).toBe(true);
    // While its id is remembered, a retried resume still learns the restore failed.
    expect((await refusalOf(engine.resume({ checkpoint_id: "base" }))).code).toBe("restore_failed");
    for (let i = 0; i < REMEMBERED_CLOSED; i++) {
      await engine.prepare({ checkpoint_id: `c${i}` });
      await engine.resume({ checkpoint_id: `c${i}` });
    }
    expect(failures.size).toBe(0);
  });

  it("the last-journal-write marker of an id whose entry was kept (LATEST's fsync failed, the term ended) is dropped: one per checkpoint otherwise, for good", async () => {
    const { engine, writer } = makeEngine(root, { members: [{ kind: "environment", instance: "e1" }] });
    const writes = (engine as unknown as { journalWrites: Map<string, number> }).journalWrites;
    // A failed fsync of LATEST keeps every closed entry (until the next publication makes it durable).
    const fsyncFailed = Promise.reject(new Error("EIO"));
    fsyncFailed.catch(() => undefined);
    writer.durable = () => fsyncFailed;
    for (let i = 0; i < 20; i++) {
      await engine.prepare({ checkpoint_id: `k${i}` });
      await engine.resume({ checkpoint_id: `k${i}` });
    }
    await new Promise((resolve) => setImmediate(resolve));
    expect(writes.size).toBe(0);
    // The term ends with a checkpoint open: its entry is the successor's, this marker nobody's.
    await engine.prepare({ checkpoint_id: "open" });
    engine.leadershipLost();
    expect(writes.size).toBe(0);
  });
});
