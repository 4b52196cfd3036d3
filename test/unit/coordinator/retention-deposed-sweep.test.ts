import { mkdtemp, readdir, rm, utimes } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { LEFTOVER_TEMP_AGE_MS } from "../../../coordinator/publication/retention.js";
import { makeEngine, writeParticipant, writers } from "./fake-participants.js";
import { deferred } from "../../support/deferred.js";

// `held`: the next listing of that directory (the clean-up's sweep) waits for `release`, so the
// sweep queued while leading runs only once leadership is lost and the successor staged. `reached`
// is called once it is held: the test waits for it, or its own listing (latestTemps) could be the
// one held when the sweep is queued behind the publication's background work (a loaded machine).
const sweep = vi.hoisted(() => ({ held: undefined as string | undefined, release: Promise.resolve(), reached: () => {} }));
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const readdir = (async (...args: Parameters<typeof real.readdir>) => {
    if (sweep.held !== undefined && String(args[0]) === sweep.held) {
      sweep.held = undefined;
      sweep.reached();
      await sweep.release;
    }
    return (real.readdir as (...a: unknown[]) => unknown)(...args);
  }) as typeof real.readdir;
  return withOverrides(real, { readdir });
});

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-deposed-sweep-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

async function publish(writer: GlobalManifestWriter, id: string, at: number) {
  const participants = [await writeParticipant(root, id, "agent", "a1", [])];
  return writer.publish({ checkpointId: id, epoch: 4, preparedAt: at - 1, publishedAt: at, stop: false, scope: null, restarts: [], participants, controllerState: null });
}

async function latestTemps(): Promise<string[]> {
  return (await readdir(root)).filter((name) => name.startsWith(".LATEST."));
}

// Two coordinators of one deployment share the root. The deposed one's clean-up, queued while it led
// (behind a slow removal of old checkpoints), runs after its successor staged LATEST's temp file for a
// prepare that has lasted past LEFTOVER_TEMP_AGE_MS: it must not take that file for a crashed
// writer's, or the successor's publication fails (storage_error, its rename finding no temp file).
describe("a deposed leader's retention clean-up", () => {
  it("leaves the LATEST temp file its successor staged for a long prepare", async () => {
    const deposed = new GlobalManifestWriter(new CheckpointCatalog(root), 1);
    const successor = new GlobalManifestWriter(new CheckpointCatalog(root), 1);
    await publish(deposed, "c1", 100);
    await publish(deposed, "c2", 200);
    const slowRemoval = deferred();
    const reached = deferred();
    sweep.held = root;
    sweep.release = slowRemoval.promise;
    sweep.reached = () => reached.resolve();
    let leading = true;
    expect(deposed.retain("c2", () => leading)).toEqual(["c1"]);
    await reached.promise; // the clean-up's sweep is held at its listing

    // The lease lapses; the successor stages c3 and its prepare lasts past LEFTOVER_TEMP_AGE_MS.
    leading = false;
    successor.stage("c3");
    await successor.settled();
    const [staged] = await latestTemps();
    expect(staged).toBeDefined();
    const longAgo = (Date.now() - LEFTOVER_TEMP_AGE_MS - 1000) / 1000;
    await utimes(join(root, staged!), longAgo, longAgo);
    slowRemoval.resolve();
    await deposed.settled();

    expect(await latestTemps()).toEqual([staged]);
    await publish(successor, "c3", 300);
    expect(await new CheckpointCatalog(root).latest()).toBe("c3");
  });

  it("still sweeps a crashed writer's old LATEST temp file while it leads", async () => {
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 1);
    const crashed = new GlobalManifestWriter(new CheckpointCatalog(root), 1);
    crashed.stage("c9");
    await crashed.settled();
    const [leftover] = await latestTemps();
    const longAgo = (Date.now() - LEFTOVER_TEMP_AGE_MS - 1000) / 1000;
    await utimes(join(root, leftover!), longAgo, longAgo);
    await publish(writer, "c1", 100);
    writer.retain("c1", () => true);
    await writer.settled();
    expect(await latestTemps()).toEqual([]);
  });

  // The engine hands retention its own leadership check, asked when the sweep runs, not when queued.
  it("the engine's retention asks whether its term still leads", async () => {
    const made = makeEngine(root, { retention: 1 });
    const retain = vi.spyOn(made.writer, "retain");
    await made.engine.checkpoint({ checkpoint_id: "c1", episode_ids: null, stop: false, controller_state: null });
    const stillLeading = retain.mock.calls[0]?.[1];
    expect(stillLeading?.()).toBe(true);
    made.leadership.demote();
    expect(stillLeading?.()).toBe(false);
  });
});
