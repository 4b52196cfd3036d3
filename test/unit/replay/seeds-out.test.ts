import { constants } from "node:buffer";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, open, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { toCheckpointError } from "../../../protocol/index.js";
import { assertWritableOut, LINE_PIECE_UNITS, writeJsonLines } from "../../../participants/replay/out-file.js";
import { writeFileAtomic } from "../../../participants/storage/fs-durable.js";

// stat of these paths fails with the errno given (tests run as root: permissions cannot make EACCES).
const statFails = vi.hoisted(() => new Map<string, string>());
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof import("node:fs/promises")>();
  const stat = (async (path: string, ...rest: unknown[]) => {
    const code = statFails.get(String(path));
    if (code !== undefined) throw Object.assign(new Error(`${code}: injected, stat '${String(path)}'`), { code, syscall: "stat", path: String(path) });
    return (actual.stat as (...args: unknown[]) => unknown)(path, ...rest);
  }) as typeof actual.stat;
  return withOverrides(actual, { stat });
});

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "seeds-out-"));
});
afterEach(async () => {
  statFails.clear();
  await rm(dir, { recursive: true, force: true });
});

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

  // Every stat error was "does not exist" (the directory) or "is not accessible" (--out):
  // invalid_request, exit 2, which tells the operator to fix a path the mount is at fault for.
  it("a directory or --out the storage refuses to stat (EIO, EACCES) is storage_error, as for collect's --out; a path that cannot be is invalid_request", async () => {
    const out = join(dir, "s.jsonl");
    for (const [path, code] of [[dir, "EIO"], [out, "EIO"], [out, "EACCES"], [dir, "ESTALE"]] as const) {
      statFails.clear();
      statFails.set(path, code);
      const error = await assertWritableOut(out).then(() => null, (e: unknown) => e);
      expect(toCheckpointError(error), `${code} on ${path}`).toMatchObject({ code: "storage_error", message: expect.stringContaining(code) });
    }
    statFails.clear();
    // Under a regular file (ENOTDIR), or through a link loop (ELOOP): the path's fault, invalid_request.
    await writeFile(join(dir, "file"), "");
    await expect(assertWritableOut(join(dir, "file", "s.jsonl"))).rejects.toMatchObject({ code: "invalid_request", message: `--out: directory ${join(dir, "file")} does not exist` });
    await symlink(join(dir, "loop"), join(dir, "loop"));
    await expect(assertWritableOut(join(dir, "loop"))).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("is not accessible (ELOOP)") });
  });

  it("refuses an --out that is a directory", async () => {
    await mkdir(join(dir, "sub"));
    await expect(assertWritableOut(join(dir, "sub"))).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("is not a regular file") });
  });

  it("refuses an --out that would replace what the export reads: the --tasks file, or anything in the checkpoint", async () => {
    const tasks = join(dir, "tasks.jsonl");
    await writeFile(tasks, "{}\n");
    await symlink(tasks, join(dir, "tasks-link.jsonl"));
    for (const out of [tasks, join(dir, "tasks-link.jsonl")]) {
      await expect(assertWritableOut(out, { tasks }), out).rejects.toMatchObject({ code: "invalid_request", message: `--out ${out} is the --tasks file` });
    }
    const checkpoint = join(dir, "ckpt-1");
    await mkdir(join(checkpoint, "participants"), { recursive: true });
    await writeFile(join(checkpoint, "checkpoint.json"), "{}\n");
    await symlink(checkpoint, join(dir, "ckpt-link"));
    for (const out of [join(checkpoint, "checkpoint.json"), join(checkpoint, "participants", "seeds.jsonl"), join(dir, "ckpt-link", "seeds.jsonl"), `${checkpoint}/..notes`]) {
      await expect(assertWritableOut(out, { checkpoint }), out).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("is inside the checkpoint") });
    }
    // Beside the checkpoint, even under a name it begins: allowed.
    await expect(assertWritableOut(join(dir, "seeds.jsonl"), { tasks, checkpoint })).resolves.toBeUndefined();
    await expect(assertWritableOut(join(dir, "ckpt-10.jsonl"), { tasks, checkpoint })).resolves.toBeUndefined();
  });

  it("the atomic writer leaves a missing directory missing when told not to create parents", async () => {
    await expect(writeFileAtomic(join(dir, "missing", "s.jsonl"), "x\n", { createParents: false })).rejects.toMatchObject({ code: "ENOENT" });
    expect(existsSync(join(dir, "missing"))).toBe(false);
    await writeFileAtomic(join(dir, "made", "s.jsonl"), "x\n");
    expect(existsSync(join(dir, "made", "s.jsonl"))).toBe(true);
  });
});

describe("seeds --out contents", () => {
  it("writes seeds that together are longer than any string, one JSON line each", { timeout: 60_000 }, async () => {
    const big = "x".repeat(Math.ceil(constants.MAX_STRING_LENGTH / 2.5)); // one string shared by three seeds
    const out = join(dir, "seeds.jsonl");
    await writeJsonLines(out, [{ n: 1, big }, { n: 2, big }, { n: 3, big }]);
    const handle = await open(out, "r");
    try {
      const { size } = await handle.stat();
      expect(size).toBe(3 * (JSON.stringify({ n: 1, big }).length + 1));
      const head = Buffer.alloc(16);
      await handle.read(head, 0, 16, 0);
      expect(head.toString()).toBe('{"n":1,"big":"xx');
    } finally {
      await handle.close();
    }
  });

  it("keeps every character whole where a line is split into pieces to encode it: a surrogate pair astride a piece's end, a line of exactly one piece, no values", async () => {
    // {"s":" is 6 code units: with p a's after it, the pair's first half is unit p + 6 of the line.
    const values = Array.from({ length: 5 }, (_, k) => ({ s: `${"a".repeat(LINE_PIECE_UNITS - 8 + k)}\u{1F600}é` }));
    values.push({ s: "b".repeat(LINE_PIECE_UNITS - 8) }); // its JSON is exactly LINE_PIECE_UNITS units
    const out = join(dir, "pieces.jsonl");
    await writeJsonLines(out, values);
    const text = await readFile(out, "utf8");
    expect(text.endsWith("\n")).toBe(true);
    expect(text.slice(0, -1).split("\n").map((line) => JSON.parse(line) as unknown)).toEqual(values);
    await writeJsonLines(out, []);
    expect(await readFile(out, "utf8")).toBe("");
  });
});
