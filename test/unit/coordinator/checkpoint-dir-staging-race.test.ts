import { existsSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";

// The first mkdir of a checkpoint directory is held until the test fails it (a slow, then failing,
// mkdir on shared storage); later ones are real.
const held = vi.hoisted(() => ({ next: undefined as undefined | { reject: (error: unknown) => void } }));
vi.mock("../../../protocol/index.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../protocol/index.js")>();
  return {
    ...original,
    makeDirectories: (path: string, options?: { mode?: number }) => {
      if (!held.next) return original.makeDirectories(path, options);
      return new Promise((_, reject) => {
        held.next = { reject };
      });
    },
  };
});

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-dir-race-"));
});
afterEach(async () => {
  held.next = undefined;
  await rm(root, { recursive: true, force: true });
});

const eio = () => Object.assign(new Error("EIO: i/o error, mkdir"), { code: "EIO", syscall: "mkdir" });
const stagedTemps = () => readdirSync(root).filter((name) => name.includes("LATEST"));

describe("a checkpoint directory's retried mkdir while its staging is dropped", () => {
  // Reachable through the engine: leadershipLost() runs outside the op lock, so it can drop the
  // stagings while a commit (or a successor's re-drive) waits in checkpointDirectory. `discard` is
  // called under the lock today; the writer keeps the same contract for it.
  it.each([
    ["leadership lost (discardStagedLatest)", (writer: GlobalManifestWriter) => void writer.discardStagedLatest(), true],
    ["the checkpoint closed (discard)", (writer: GlobalManifestWriter) => void writer.discard("c1"), undefined],
  ])("%s while the commit waits for the first mkdir: no LATEST temp file is staged again and left behind", async (_what, drop, dir) => {
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 2);
    held.next = { reject: () => undefined };
    writer.stage("c1");
    const waiting = writer.checkpointDirectory("c1");
    drop(writer);
    held.next!.reject(eio());
    held.next = undefined;
    await waiting.catch(() => undefined);
    await writer.settled();
    expect(stagedTemps()).toEqual([]);
    if (dir) expect(existsSync(join(root, "c1"))).toBe(true); // what the commit waited for
    // Nothing staged is kept for it either: a later publication of c1 stages afresh.
    expect((writer as unknown as { staged: Map<string, unknown> }).staged.has("c1")).toBe(false);
  });
});
