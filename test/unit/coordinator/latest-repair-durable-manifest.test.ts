import { writeFile } from "node:fs/promises";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { writeParticipant } from "./fake-participants.js";

// Records, in order, the directory fsyncs the writer asks for and its durable replaces (still done).
const events = vi.hoisted(() => [] as string[]);
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  return {
    ...original,
    fsyncDirectory: vi.fn(async (dir: string) => {
      events.push(`fsync ${dir}`);
      return original.fsyncDirectory(dir);
    }),
    fsyncDirectoryInPool: vi.fn(async (dir: string) => {
      events.push(`fsync ${dir}`);
      return original.fsyncDirectoryInPool(dir);
    }),
    replaceSmallFileDurably: vi.fn(async (path: string, data: string | Uint8Array, beforeRename?: () => void) => {
      events.push(`replace ${path}`);
      return original.replaceSmallFileDurably(path, data, beforeRename);
    }),
  };
});

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-repair-"));
  events.length = 0;
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

async function publish(writer: GlobalManifestWriter, id: string, at: number): Promise<void> {
  const entries = [await writeParticipant(root, id, "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}'])];
  await writer.publish({ checkpointId: id, epoch: 4, preparedAt: at - 1, publishedAt: at, stop: false, scope: null, restarts: [], participants: entries, controllerState: null });
}

describe("recovery pointing LATEST at a checkpoint.json its predecessor left", () => {
  // The predecessor died after checkpoint.json's rename, before its directory's fsync (and so before
  // LATEST's rename): the new leader reads checkpoint.json from the page cache. Pointing LATEST at
  // it durably without making checkpoint.json durable first leaves, after a power loss, a LATEST
  // naming a checkpoint without checkpoint.json (restore of LATEST: not_found), its journal entry gone.
  it("fsyncs the checkpoint directory before LATEST's replace", async () => {
    const predecessor = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
    await publish(predecessor, "c1", 100);
    await publish(predecessor, "c2", 200);
    await predecessor.settled();
    await writeFile(join(root, "LATEST"), "c1\n"); // LATEST's rename never happened

    events.length = 0;
    const successor = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
    expect(await successor.repairLatest("c2", () => undefined)).toBe("repaired");
    expect(await new CheckpointCatalog(root).latest()).toBe("c2");
    const replaced = events.indexOf(`replace ${join(root, "LATEST")}`);
    expect(replaced).toBeGreaterThan(-1);
    expect(events.slice(0, replaced)).toContain(`fsync ${join(root, "c2")}`);
    await successor.settled();
  });
});
