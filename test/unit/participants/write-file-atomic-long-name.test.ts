import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { writeJsonLines } from "../../../participants/replay/out-file.js";
import { writeFileAtomic } from "../../../participants/storage/fs-durable.js";

/** The longest file name most file systems take (NAME_MAX), in bytes. */
const NAME_MAX = 255;

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-long-name-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("writeFileAtomic with a target name near the file system's limit", () => {
  it("publishes a name the file system takes, though its temp name (dot, name, pid, hex, .tmp) would not fit", async () => {
    const name = `${"s".repeat(NAME_MAX - 6)}.jsonl`;
    expect(Buffer.byteLength(name)).toBe(NAME_MAX);
    await writeFileAtomic(join(root, name), "a\n", { createParents: false });
    expect(await readFile(join(root, name), "utf8")).toBe("a\n");
    expect(await readdir(root)).toEqual([name]); // no temp file left behind
  });

  it("cuts a multibyte name's temp name on a character boundary, and exclusive writes publish too", async () => {
    const name = `${"é".repeat(120)}.json`; // 245 bytes
    expect(await writeFileAtomic(join(root, name), "b\n", { exclusive: true })).toBe(true);
    expect(await writeFileAtomic(join(root, name), "c\n", { exclusive: true })).toBe(false);
    expect(await readFile(join(root, name), "utf8")).toBe("b\n");
    expect(await readdir(root)).toEqual([name]);
  });

  it("seeds --out's writer takes such a name (it was storage_error ENAMETOOLONG)", async () => {
    const out = join(root, `${"t".repeat(NAME_MAX - 6)}.jsonl`);
    await writeJsonLines(out, [{ n: 1 }, { n: 2 }]);
    expect(await readFile(out, "utf8")).toBe('{"n":1}\n{"n":2}\n');
  });
});
