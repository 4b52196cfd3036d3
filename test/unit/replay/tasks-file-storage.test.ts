import * as fs from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable } from "node:stream";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { toCheckpointError } from "../../../protocol/index.js";
import { ReplayError } from "../../../participants/replay/index.js";
import { readTaskFile } from "../../../participants/replay/task-file.js";

// Reading these paths fails with the errno given (tests run as root: permissions cannot make EACCES).
const readFails = vi.hoisted(() => new Map<string, string>());
vi.mock("node:fs", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fs>();
  const createReadStream = ((path: string, ...rest: unknown[]) => {
    const code = readFails.get(String(path));
    if (code === undefined) return (actual.createReadStream as (...a: unknown[]) => unknown)(path, ...rest);
    return new Readable({
      read() {
        this.destroy(Object.assign(new Error(`${code}: injected, read`), { code, syscall: "read" }));
      },
    });
  }) as typeof actual.createReadStream;
  return withOverrides(actual, { createReadStream });
});

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "seeds-tasks-"));
});
afterEach(async () => {
  readFails.clear();
  await rm(dir, { recursive: true, force: true });
});

/**
 * docs/replay.md (`gym-ckpt seeds`): a missing or malformed --tasks file is invalid_request (exit 2,
 * fix the flag); a file call the storage refused is storage_error (exit 1, fix the disk or mount),
 * as `collect --tasks` reads the same file. An --tasks file there that the storage would not read
 * (EIO, EACCES) was "cannot be read", invalid_request.
 */
describe("seeds --tasks the storage refuses", () => {
  it.each(["EIO", "EACCES", "ESTALE"])("%s is storage_error naming the file, not invalid_request", async (code) => {
    const file = join(dir, "tasks.jsonl");
    await writeFile(file, '{"expression":"1+1"}\n');
    readFails.set(file, code);
    const error = await readTaskFile(file).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).not.toBeInstanceOf(ReplayError);
    expect(toCheckpointError(error)).toMatchObject({ code: "storage_error", message: expect.stringContaining(file) });
  });

  it("a missing file, a directory and a malformed line stay invalid_request", async () => {
    await expect(readTaskFile(join(dir, "missing.jsonl"))).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("does not exist") });
    await expect(readTaskFile(dir)).rejects.toMatchObject({ code: "invalid_request" });
    await writeFile(join(dir, "bad.jsonl"), "{nope\n");
    await expect(readTaskFile(join(dir, "bad.jsonl"))).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(":1: not JSON") });
  });
});
