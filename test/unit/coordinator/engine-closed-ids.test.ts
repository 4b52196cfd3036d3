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
});
