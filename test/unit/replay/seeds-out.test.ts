import { existsSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { assertWritableOut } from "../../../participants/replay/out-file.js";
import { writeFileAtomic } from "../../../participants/storage/fs-durable.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "seeds-out-"));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

describe("seeds --out", () => {
  it("accepts a new file in an existing directory and an existing regular file", async () => {
    await expect(assertWritableOut(join(dir, "new.jsonl"))).resolves.toBeUndefined();
    await writeFile(join(dir, "old.jsonl"), "x\n");
    await expect(assertWritableOut(join(dir, "old.jsonl"))).resolves.toBeUndefined();
  });

  it("refuses a missing directory with invalid_request and creates nothing", async () => {
    await expect(assertWritableOut(join(dir, "missing", "s.jsonl"))).rejects.toMatchObject({
      code: "invalid_request",
      message: `--out: directory ${join(dir, "missing")} does not exist`,
    });
    expect(existsSync(join(dir, "missing"))).toBe(false);
  });

  it("refuses an --out that is a directory", async () => {
    await mkdir(join(dir, "sub"));
    await expect(assertWritableOut(join(dir, "sub"))).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("is not a regular file") });
  });

  it("the atomic writer leaves a missing directory missing when told not to create parents", async () => {
    await expect(writeFileAtomic(join(dir, "missing", "s.jsonl"), "x\n", { createParents: false })).rejects.toMatchObject({ code: "ENOENT" });
    expect(existsSync(join(dir, "missing"))).toBe(false);
    await writeFileAtomic(join(dir, "made", "s.jsonl"), "x\n");
    expect(existsSync(join(dir, "made", "s.jsonl"))).toBe(true);
  });
});
