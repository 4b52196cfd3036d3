import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { JsonValue } from "../../../participants/kinds/resources/index.js";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { refusalCode } from "../../support/refusal.js";
import { counterRecord, resourcesWorld } from "./resources-world.js";

let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

describe("a restore install that outlived its deadline and is still running", () => {
  it("a later restore is refused (not fresh) until the late install has ended and been freed, instead of installing beside it", async () => {
    let hooksRunning = 0;
    let overlapped = false;
    let first = true;
    // The first install waits for this, released only once the later restore was answered: still
    // running then, however slow the machine (a timer raced the retire and resume under load).
    let releaseFirst!: () => void;
    const firstHeld = new Promise<void>((resolve) => (releaseFirst = resolve));
    class SlowFirstRestore extends CounterServer {
      override async restoreSessionStates(states: Record<string, JsonValue>): Promise<void> {
        hooksRunning++;
        if (hooksRunning > 1) overlapped = true;
        try {
          if (first) {
            first = false;
            await firstHeld;
          }
          await super.restoreSessionStates(states);
        } finally {
          hooksRunning--;
        }
      }
    }
    const r1 = counterRecord("r1", "sessionAAAA", 2);
    const r2 = counterRecord("r2", "sessionBBBB", 7);
    await world.writeCheckpoint("c1", [r1]);
    await world.writeCheckpoint("c2", [r2]);
    const b = await world.harness(new SlowFirstRestore());
    expect(await refusalCode(b.call("restore", { checkpoint_id: "c1", episode_ids: [r1.episode_id] }, 0.2))).toBe("deadline_exceeded");
    // The coordinator's clean-up, as in restore-deadline.test.ts.
    await b.call("retire", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 1 }] }, 2);
    await b.call("resume", { checkpoint_id: "c1" }, 2);
    // The late install of c1 is still running: this process is not fresh (docs/protocol.md: restore
    // "only into a process with no live state").
    const second = await b.call("restore", { checkpoint_id: "c2", episode_ids: [r2.episode_id] }, 5).then(
      () => "restored",
      (error: { code?: string }) => error.code ?? String(error),
    );
    releaseFirst();
    expect(overlapped).toBe(false);
    expect(second).not.toBe("restored");
  }, 20_000);
});
