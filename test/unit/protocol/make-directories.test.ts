import { mkdir, mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeDirectories } from "../../../protocol/make-directories.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-mkdirs-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("makeDirectories", () => {
  it("creates every missing level and accepts an existing directory", async () => {
    const deep = join(dir, "a", "b", "c");
    await makeDirectories(deep);
    expect((await stat(deep)).isDirectory()).toBe(true);
    await makeDirectories(deep);
    await makeDirectories(dir);
  });

  it("returns the first directory it created, as Node's recursive mkdir does, and undefined when there was nothing to create", async () => {
    expect(await makeDirectories(join(dir, "a", "b", "c"))).toBe(join(dir, "a"));
    expect(await mkdir(join(dir, "n", "b", "c"), { recursive: true })).toBe(join(dir, "n"));
    expect(await makeDirectories(join(dir, "a", "b", "d"))).toBe(join(dir, "a", "b", "d"));
    expect(await makeDirectories(join(dir, "a", "b", "c"))).toBeUndefined();
    expect(await mkdir(join(dir, "n", "b", "c"), { recursive: true })).toBeUndefined();
  });

  it("creates every level with the mode given", async () => {
    await makeDirectories(join(dir, "p", "q"), { mode: 0o700 });
    expect([(await stat(join(dir, "p"))).mode & 0o777, (await stat(join(dir, "p", "q"))).mode & 0o777]).toEqual([0o700, 0o700]);
  });

  it("refuses a file in the way and a path below a file with their own codes", async () => {
    await writeFile(join(dir, "f"), "x");
    await expect(makeDirectories(join(dir, "f"))).rejects.toMatchObject({ code: "EEXIST" });
    await expect(makeDirectories(join(dir, "f", "sub", "deeper"))).rejects.toMatchObject({ code: "ENOTDIR" });
  });

  it("answers ENOENT where mkdir(2) does under an existing parent (/proc), where Node 20's recursive mkdir spins for ever", { timeout: 5000 }, async () => {
    await expect(makeDirectories(`/proc/gym-ckpt-${process.pid}/a/b`)).rejects.toMatchObject({ code: "ENOENT" });
  });
});
