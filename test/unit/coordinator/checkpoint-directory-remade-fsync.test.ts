import { mkdtemp, rm, rmdir, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { fsyncDirectory } from "../../../coordinator/publication/durable-fs.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";

// Records which directories the writer fsyncs (they are still fsynced).
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  return { ...original, fsyncDirectory: vi.fn(original.fsyncDirectory) };
});

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-remade-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("a staged checkpoint directory removed before the first commit", () => {
  // stillStaged: it is "made again, and the root fsynced before any commit is sent into it, as
  // staging does": without that fsync a power loss can drop the directory with what commits wrote.
  it("is made again and the root fsynced before checkpointDirectory settles", async () => {
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
    await writer.checkpointDirectory("c1");
    await rmdir(join(root, "c1")); // an operator's cleanup
    const fsynced = vi.mocked(fsyncDirectory);
    fsynced.mockClear();
    await writer.checkpointDirectory("c1");
    expect((await stat(join(root, "c1"))).isDirectory()).toBe(true);
    expect(fsynced.mock.calls.map(([dir]) => dir)).toContain(root);
    await writer.discard("c1");
  });
});
