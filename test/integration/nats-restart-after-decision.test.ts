import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointError } from "../../protocol/index.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("nats-server killed between the commit decision and the commits, then restarted on the same store", () => {
  it("the journaled decision is completed (committed, published, LATEST) and nobody is left parked", async () => {
    let killed!: () => void;
    const whenKilled = new Promise<void>((resolve) => (killed = resolve));
    let armed = true;
    const coordinator = await world.startCoordinator(
      NO_HTTP,
      {
        hooks: {
          afterDecision: async () => {
            if (!armed) return;
            armed = false;
            await world.nats.server.kill();
            killed();
          },
        },
      },
    );
    await coordinator.whenReady();
    const first = world.client.checkpoint({ checkpoint_id: "decided-then-killed", deadline_ts: Date.now() / 1000 + 30 }).then(
      (reply) => ({ reply }),
      (error: unknown) => ({ error }),
    );
    await whenKilled;
    await world.nats.server.restart();
    const outcome = await first;
    if ("error" in outcome) expect(outcome.error).toBeInstanceOf(CheckpointError);
    // The controller retries the same op with the same id until a leader answers it.
    const end = Date.now() + 20_000;
    let reply: Awaited<ReturnType<typeof world.client.checkpoint>> | undefined = "reply" in outcome ? outcome.reply : undefined;
    while (!reply) {
      try {
        reply = await world.client.checkpoint({ checkpoint_id: "decided-then-killed", deadline_ts: Date.now() / 1000 + 5 });
      } catch (error) {
        if (Date.now() > end) throw error;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    }
    expect(reply.participants).toBe(5);
    expect(readFileSync(join(world.root, "LATEST"), "utf8").trim()).toBe("decided-then-killed");
    expect(existsSync(join(world.root, "decided-then-killed", "checkpoint.json"))).toBe(true);
    await waitUntil(() => world.participants.every((p) => p.handle.controlPlane.currentPhase === "idle"), "every participant resumed", 10_000);
  }, 60_000);
});
