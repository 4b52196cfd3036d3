import { existsSync } from "node:fs";
import { join } from "node:path";
import { jetstreamManager } from "@nats-io/jetstream";
import { afterEach, describe, expect, it } from "vitest";
import { journalBucket } from "../../protocol/index.js";
import { monitorPhaseMessages, startWorld, type World } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";

let world: World | undefined;
afterEach(async () => {
  await world?.close();
  world = undefined;
});

describe("a commit decision whose KV write fails (the journal's stream deleted under it)", () => {
  it("sends no commit, resumes everyone, publishes nothing, and answers outcome_unknown", async () => {
    const w = (world = await startWorld());
    await w.startParticipants();
    const coordinator = await w.startCoordinator({}, {
      hooks: { beforeDecision: async () => (await jetstreamManager(w.pnc)).streams.delete(`KV_${journalBucket(w.deployment)}`).then(() => undefined) },
    });
    await coordinator.whenReady();
    const monitor = monitorPhaseMessages(w.pnc, w.deployment);
    await w.pnc.flush();
    const error = await refusalOf(w.client.checkpoint({ checkpoint_id: "undecided-1" }));
    await w.pnc.flush();
    monitor.stop();
    expect(error.code).toBe("outcome_unknown");
    expect(error.message).toContain("no commit was sent");
    expect(monitor.log.filter((m) => m.op === "commit")).toEqual([]);
    expect(monitor.log.filter((m) => m.op === "resume")).toHaveLength(5);
    for (const p of w.participants) expect(`${p.instance}:${p.handle.controlPlane.currentPhase}`).toBe(`${p.instance}:idle`);
    expect(existsSync(join(w.root, "LATEST"))).toBe(false);
    expect(existsSync(join(w.root, "undecided-1", "checkpoint.json"))).toBe(false);
  });
});
