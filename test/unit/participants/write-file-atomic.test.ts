import type { FileHandle } from "node:fs/promises";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { writeFileAtomic } from "../../../participants/storage/fs-durable.js";

// Below the helper: every fsync of a directory is recorded; the next one of `failDir` fails (EIO).
const fs = vi.hoisted(() => ({ failDir: undefined as string | undefined, synced: [] as string[] }));
vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const original = await importOriginal<typeof import("node:fs/promises")>();
  const open = async (...args: Parameters<typeof original.open>): Promise<FileHandle> => {
    const handle = await original.open(...args);
    if (args[1] !== "r") return handle; // fsyncDir opens a directory "r"
    const path = String(args[0]);
    return handleWith(handle, {
      sync: async () => {
        if (fs.failDir === path) {
          fs.failDir = undefined;
          throw Object.assign(new Error(`EIO: i/o error, fsync`), { code: "EIO", syscall: "fsync" });
        }
        fs.synced.push(path);
        return handle.sync();
      },
    });
  };
  return withOverrides(original, { open });
});

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-atomic-"));
  fs.synced = [];
});
afterEach(async () => {
  fs.failDir = undefined;
  await rm(root, { recursive: true, force: true });
});

describe("writeFileAtomic", () => {
  it("a retry after the fsync of a created directory's parent failed still fsyncs it: the retry creates nothing, but the entry is not durable yet", async () => {
    const target = join(root, "step_1", "rollouts.jsonl");
    fs.failDir = root; // holds step_1's entry
    await expect(writeFileAtomic(target, "a\n")).rejects.toMatchObject({ code: "EIO" });
    fs.synced = [];
    expect(await writeFileAtomic(target, "a\n")).toBe(true);
    expect(await readFile(target, "utf8")).toBe("a\n");
    // Without root's fsync, a power loss after this write can drop step_1 with the file in it.
    expect(fs.synced.sort()).toEqual([root, join(root, "step_1")].sort());
  });

  it("an exclusive write whose directory fsync failed after its link: the retry, finding its own file there (false), still fsyncs that directory", async () => {
    const target = join(root, "records.jsonl");
    await writeFileAtomic(join(root, "other"), "x"); // the directory exists
    fs.failDir = root;
    await expect(writeFileAtomic(target, "a\n", { exclusive: true })).rejects.toMatchObject({ code: "EIO" });
    fs.synced = [];
    expect(await writeFileAtomic(target, "a\n", { exclusive: true })).toBe(false);
    // Its caller takes the file for one a concurrent writer published durably: it must be.
    expect(fs.synced).toEqual([root]);
  });
});
