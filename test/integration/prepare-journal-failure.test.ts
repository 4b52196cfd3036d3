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

describe("a prepare whose open entry cannot be journaled (the journal's stream deleted under it)", () => {
  it("resumes everyone and answers journal_unavailable (not internal_error), the same again to a retry of that id", async () => {
    const w = (world = await startWorld());
    await w.startParticipants();
    const coordinator = await w.startCoordinator();
    await coordinator.whenReady();
    // JetStream KV unavailable for the journal: the entry beside the first prepare stage fails.
    await (await jetstreamManager(w.pnc)).streams.delete(`KV_${journalBucket(w.deployment)}`);
    const monitor = monitorPhaseMessages(w.pnc, w.deployment);
    await w.pnc.flush();
    const error = await refusalOf(w.client.checkpoint({ checkpoint_id: "unjournaled-1" }));
    await w.pnc.flush();
    monitor.stop();
    expect(error.code).toBe("journal_unavailable");
    expect(error.message).toContain("every participant was resumed");
    expect(monitor.log.filter((m) => m.op === "commit")).toEqual([]);
    expect(monitor.log.filter((m) => m.op === "resume").length).toBeGreaterThan(0);
    for (const p of w.participants) expect(`${p.instance}:${p.handle.controlPlane.currentPhase}`).toBe(`${p.instance}:idle`);
    // A retry of that id (its reply lost, say) is told the same, not a bare stale_checkpoint.
    const again = await refusalOf(w.client.checkpoint({ checkpoint_id: "unjournaled-1" }));
    expect(again.code).toBe("journal_unavailable");
    expect(again.message).toBe(error.message);
    const prepared = await refusalOf(w.client.prepare({ checkpoint_id: "unjournaled-1" }));
    expect(prepared.code).toBe("journal_unavailable");
  });
});
