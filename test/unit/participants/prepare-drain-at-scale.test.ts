import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * A prepare waits for thousands of episodes to reach a boundary, and each one's park notifies the
 * control plane from its own I/O callback. A readiness check (each O(episodes) in the real kinds:
 * 0.5 ms at 10,000) per notification made the drain quadratic: 10,000 parks, about 5 s of event loop.
 */
const T0 = 1_700_000_000;
const N = 2000;

let root: string;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-drain-"));
  kind = new ScriptableKind("environment");
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock: new ManualClock(T0 * 1000), leaseGraceSeconds: 60, checkpointRoot: root });
});
afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

it("a prepare whose N blockers clear one per callback, all in one event-loop turn, checks readiness a few times, not N", async () => {
  const blockers = Array.from({ length: N }, (_, i) => `r${i}`);
  kind.setBlockers(blockers);
  let checks = 0;
  const readiness = kind.readiness.bind(kind);
  kind.readiness = () => {
    checks++;
    return readiness();
  };
  const prepared = plane.handle("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1 });
  await waitUntil(() => kind.hooks().includes("closeAdmission") && checks > 0, "the prepare waiting for readiness");
  const before = checks;
  // Queued together, so they run in one check phase, each its own callback (microtasks drained between).
  await new Promise<void>((resolve) => {
    for (let i = 0; i < N; i++) {
      setImmediate(() => {
        kind.setBlockers(blockers.slice(i + 1));
        if (i === N - 1) resolve();
      });
    }
  });
  expect((await prepared).phase).toBe("prepared");
  expect(checks - before).toBeLessThanOrEqual(5);
});
