import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { verifyCheckpoint } from "../../coordinator/publication/verify-checkpoint.js";
import { startGymBase, startGymWorld, type GymBase, type GymWorld } from "../support/gym-processes.js";
import { canMountTmpfs, mountSmallDisk, type SmallDisk } from "../support/tmpfs-mount.js";

/**
 * The reference Gym and a coordinator whose checkpoint root is a real 4 MiB tmpfs that fills:
 * whichever write the full disk refuses (a participant's records or manifest, checkpoint.json,
 * LATEST's temp file), the checkpoint op is refused storage_error, LATEST keeps naming a complete
 * checkpoint that verifies, every participant is idle again, nothing half-written is listed (the
 * failed attempt's directory is gone), and once there is room again a checkpoint publishes and no commit or publication temp file is left.
 * Needs mount rights (root, not in every CI container): skipped where a tmpfs cannot be mounted.
 */

let disk: SmallDisk | undefined;
let base: GymBase | undefined;
let world: GymWorld | undefined;

beforeAll(async () => {
  if (!canMountTmpfs) return;
  disk = mountSmallDisk("gym-ckpt-disk-full", "4m");
  base = await startGymBase();
  world = await startGymWorld({ base, rootParent: disk.dir });
}, 60_000);

afterAll(async () => {
  await world?.close().catch(() => undefined);
  await base?.close().catch(() => undefined);
  disk?.remove();
});

/** Every file under `dir`, as paths relative to it. */
function files(dir: string, prefix = ""): string[] {
  return readdirSync(join(dir, prefix), { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? files(dir, join(prefix, e.name)) : [join(prefix, e.name)],
  );
}

describe.skipIf(!canMountTmpfs)("checkpoints on a checkpoint root whose disk fills (real tmpfs; needs mount rights)", () => {
  it("each refusal is storage_error and changes no state; LATEST stays complete; a retry with room publishes and leaves no temp file", async () => {
    const w = world!;
    const catalog = new CheckpointCatalog(w.root);
    const latest = () => readFileSync(join(w.root, "LATEST"), "utf8").trim();
    await w.client.checkpoint({ checkpoint_id: "before", episode_ids: [] });
    let published = "before";
    let refusals = 0;
    // From nothing left to room for everything: each step lets a later write of the checkpoint fit.
    for (let leave = 0; leave <= 24 * 1024; leave += 4096) {
      const id = `full-${leave}`;
      disk!.fill(leave);
      const outcome = await w.client.checkpoint({ checkpoint_id: id, episode_ids: [] }).then(
        () => undefined,
        (error: { code?: string; message?: string }) => error,
      );
      disk!.free();
      if (outcome) {
        refusals++;
        expect(outcome.code, `${id}: ${outcome.message}`).toBe("storage_error");
        expect(outcome.message).toMatch(/ENOSPC/);
        // Abandoned: what its participants did commit goes now, not at the next publication, which
        // on a disk that checkpoints filled may never come.
        await w.waitFor(() => !existsSync(join(w.root, id)), `${id}'s directory to go`);
      } else {
        published = id;
      }
      expect(latest()).toBe(published);
      await expect(verifyCheckpoint(catalog, published)).resolves.toMatchObject({ checkpoint_id: published });
      expect(catalog.scan().published.map((e) => e.checkpoint_id)).toContain(published);
      expect(catalog.scan().published.map((e) => e.checkpoint_id)).not.toContain(outcome ? id : "-");
      for (const name of ["environment", "agent", "model", "resources"] as const) expect((await w.status(name)).phase).toBe("idle");
    }
    expect(refusals).toBeGreaterThan(0);

    await w.client.checkpoint({ checkpoint_id: "after", episode_ids: [] });
    expect(latest()).toBe("after");
    await verifyCheckpoint(catalog, "after");
    // Temp files of commits (records, manifest) and of publication (checkpoint.json): none left behind.
    const temps = files(w.root).filter((path) => /(^|\/)\.(records\.jsonl|manifest\.json|checkpoint\.json)\./.test(path));
    expect(temps).toEqual([]);
  }, 120_000);
});
