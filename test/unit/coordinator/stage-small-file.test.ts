import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { replaceSmallFileDurably, stageSmallFile, tempPathFor } from "../../../coordinator/publication/durable-fs.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-stage-small-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("stageSmallFile (LATEST's staging, checkpoint.json's first half)", () => {
  it("writes and fsyncs a temp file beside the target, nothing under the target yet", async () => {
    const staged = await stageSmallFile(join(dir, "LATEST"), "c1\n");
    expect(staged.target).toBe(join(dir, "LATEST"));
    expect(await readFile(staged.temp, "utf8")).toBe("c1\n");
    expect(await readdir(dir)).toEqual([staged.temp.slice(dir.length + 1)]);
  });

  it("refuses a temp path that already exists (EEXIST, naming it) and leaves that file alone: it is someone else's", async () => {
    const target = join(dir, "LATEST");
    const temp = tempPathFor(target);
    await writeFile(temp, "another writer's\n");
    await expect(stageSmallFile(target, "c2\n", temp)).rejects.toMatchObject({ code: "EEXIST", message: expect.stringContaining(temp) });
    expect(await readFile(temp, "utf8")).toBe("another writer's\n");
  });

  it("replaceSmallFileDurably leaves no temp file behind when the rename is refused", async () => {
    const target = join(dir, "checkpoint.json");
    await expect(
      replaceSmallFileDurably(target, "{}\n", () => {
        throw new Error("deposed");
      }),
    ).rejects.toThrow("deposed");
    expect(await readdir(dir)).toEqual([]);
  });
});
