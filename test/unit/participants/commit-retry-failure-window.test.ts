import type * as fsPromises from "node:fs/promises";
import { mkdtemp, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import type { CheckpointStorage } from "../../../participants/storage/checkpoint-storage.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { waitUntil } from "../../support/wait-until.js";
import { deferred } from "../../support/deferred.js";

// A retried commit chooses, under the lock, to join the write its first attempt started; that
// write's failure clean-up runs outside the lock. The retry's arrival is held at its check that the
// checkpoint directory exists (a stat), so the test releases it a chosen number of microtasks
// before or after the first attempt's failure: every interleaving, the window between the retry's
// locked step and its joining the write included.
let heldStat: { path: string; entered: boolean; release: Promise<void> } | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    stat: async (...args: Parameters<typeof actual.stat>) => {
      const held = heldStat;
      const info = await actual.stat(...args);
      if (held && args[0] === held.path) {
        // Held once the file system answered: from its release on, the retry runs no I/O up to its write.
        heldStat = undefined;
        held.entered = true;
        await held.release;
      }
      return info;
    },
  });
});

const T0 = 1_700_000_000;
const GRACE = 60;
const FIRST_DEADLINE = T0 + 100;
const RETRY_DEADLINE = T0 + 200;

let root: string | undefined;
let plane: ParticipantControlPlane | undefined;
afterEach(async () => {
  heldStat = undefined;
  plane?.dispose();
  if (root) await rm(root, { recursive: true, force: true });
});


type FailingStep = "export" | "store";

/**
 * The first commit fails at `step` (its export, or its store after exporting); the retry arrives
 * `offset` microtasks after that failure is released (negative: before). Returns what each answered.
 */
async function race(step: FailingStep, offset: number) {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-commit-window-"));
  const clock = new ManualClock(T0 * 1000);
  const kind = new ScriptableKind("environment");
  const fs = new FsCheckpointStorage();
  const storeGate = deferred();
  let stores = 0;
  const storage: CheckpointStorage = {
    async write(target, records, options) {
      stores += 1;
      if (step === "store" && stores === 1) {
        await storeGate.promise;
        throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });
      }
      return fs.write(target, records, options);
    },
    read: (...args) => fs.read(...args),
  };
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: GRACE, checkpointRoot: root });
  kind.addEpisode({ rollout_id: "r1", attempt: 0 });
  await plane.handle("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1 });
  createCheckpointDir(root, "c1");
  const commit = (deadline: number) =>
    plane!.handle("commit", { checkpoint_id: "c1", checkpoint_dir: join(root!, "c1"), episode_ids: null, stop: false, deadline_ts: deadline, epoch: 1 });

  const exportGate = deferred();
  if (step === "export") {
    kind.delay("exportRecords", exportGate.promise);
    kind.failNext("exportRecords", new Error("export failed"));
  }
  const failure = step === "export" ? exportGate : storeGate;
  const first = commit(FIRST_DEADLINE).then(
    (reply) => reply,
    (error: Error) => error,
  );
  await waitUntil(() => (step === "export" ? kind.hooks().includes("exportRecords") : stores === 1), "the first commit's write to start");

  const arrival = deferred();
  heldStat = { path: join(root, "c1"), entered: false, release: arrival.promise };
  const held = heldStat;
  const retry = commit(RETRY_DEADLINE).then(
    (reply) => reply,
    (error: Error) => error,
  );
  await waitUntil(() => held.entered, "the retry to reach its directory check");
  // Each `await` below is one microtask; offsets -0 and 0 release both in the same step, in either order.
  const [earlier, later] = Object.is(offset, -0) || offset < 0 ? [arrival, failure] : [failure, arrival];
  earlier.resolve();
  for (let i = 0; i < Math.abs(offset); i++) await Promise.resolve();
  later.resolve();
  return { first: await first, retry: await retry, kind, manifest: join(root, "c1/gym/environment/env0/manifest.json") };
}

describe("a commit retried while its first attempt's write fails", () => {
  for (const step of ["export", "store"] as const) {
    it(`either shares that failure or commits by itself, at every interleaving (${step} fails)`, async () => {
      const seen = new Set<string>();
      for (const offset of [...Array.from({ length: 12 }, (_, i) => i - 12), -0, ...Array.from({ length: 13 }, (_, i) => i)]) {
        const { first, retry, kind, manifest } = await race(step, offset);
        const at = `offset ${Object.is(offset, -0) ? "-0" : offset}`;
        expect(first, at).toBeInstanceOf(Error);
        expect((first as Error).message, at).toMatch(step === "export" ? /export failed/ : /ENOSPC/);
        seen.add(retry instanceof Error ? "shared" : "own");
        if (retry instanceof Error) {
          // Shared the failure: nothing written, still prepared, nothing pinned, nothing extended.
          expect(retry.message, at).toBe((first as Error).message);
          expect(plane!.currentPhase, at).toBe("prepared");
          expect(existsSync(manifest), at).toBe(false);
          expect(plane!.status().lease_expires_at, at).toBe(T0 + 30 + GRACE);
        } else {
          // Committed by itself: durable, committed, its lease covering its own deadline.
          expect(retry.phase, at).toBe("committed");
          expect(plane!.currentPhase, at).toBe("committed");
          expect(existsSync(manifest), at).toBe(true);
          expect(plane!.status().lease_expires_at, at).toBe(RETRY_DEADLINE + GRACE);
        }
        // Never a stale_checkpoint (nothing resumed it), and at most one export besides the failed one.
        expect(retry instanceof CheckpointError && retry.code === "stale_checkpoint", at).toBe(false);
        expect(kind.hooks().filter((hook) => hook === "exportRecords").length, at).toBeLessThanOrEqual(step === "export" ? 2 : 1);
        plane!.dispose();
        await rm(root!, { recursive: true, force: true });
        plane = undefined;
        root = undefined;
      }
      // The sweep reaches both sides of the failure (so the window between them too).
      expect([...seen].sort()).toEqual(["own", "shared"]);
    });
  }
});
