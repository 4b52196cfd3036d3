import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { closeTaskRows, loadTask, readTaskRows } from "../../../coordinator/collect/task-rows.js";
import { readTaskRowsClosed } from "../../support/task-rows-closed.js";
import { toCheckpointError } from "../../../protocol/index.js";

/**
 * A tasks file past V8's longest string (about 512 MiB) cannot be read whole: Node refuses with
 * ERR_STRING_TOO_LONG. Writing one is too slow for a unit test, so whole-file reads of the files
 * under `huge.under` fail as Node's would, and the reader must still return every row.
 */
const huge = vi.hoisted(() => ({ under: undefined as string | undefined }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const tooLong = () => Object.assign(new Error("Cannot create a string longer than 0x1fffffe8 characters"), { code: "ERR_STRING_TOO_LONG" });
  const readFile = (async (path: Parameters<typeof real.readFile>[0], options?: Parameters<typeof real.readFile>[1]) => {
    if (huge.under !== undefined && String(path).startsWith(huge.under)) throw tooLong();
    return real.readFile(path, options);
  }) as typeof real.readFile;
  return withOverrides(real, { readFile });
});

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-tasks-"));
});
afterEach(async () => {
  huge.under = undefined;
  await rm(dir, { recursive: true, force: true });
});

describe("task rows", () => {
  it("are streamed line by line: a file too large to read as one string still loads", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, Array.from({ length: 1000 }, (_, i) => JSON.stringify({ id: `t${i}`, task: { n: i } })).join("\n") + "\n");
    huge.under = dir;
    const rows = await readTaskRows(path);
    expect(rows).toHaveLength(1000);
    expect({ rolloutId: rows[999]!.rolloutId, task: await loadTask(rows[999]!) }).toEqual({ rolloutId: "t999", task: { n: 999 } });
    await closeTaskRows(rows);
  });

  it("name the line of a refused one, counting blank and CRLF-ended lines", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"a":1}\r\n\r\n{"id":"x","task":{}}\n{"id":"x","task":{}}\n');
    await expect(readTaskRows(path)).rejects.toMatchObject({ code: "invalid_request", message: `${path}:4: duplicate id x` });
    await writeFile(path, '{"a":1}\n{not json\n');
    await expect(readTaskRows(path)).rejects.toMatchObject({ code: "invalid_request", message: `${path}:2: not JSON` });
    await expect(readTaskRows(join(dir, "missing.jsonl"))).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("does not exist") });
    await expect(readTaskRows(dir)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("EISDIR") });
  });

  it("skip a UTF-8 byte order mark before the first line (Windows editors write one), and send that row's task as written", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"id":"a","task":{"n":1}}\r\n{"n":2}\r\n')]));
    const rows = await readTaskRows(path);
    expect(rows.map((r) => r.rolloutId)).toEqual(["a", "row-2"]);
    expect(await Promise.all(rows.map((r) => loadTask(r)))).toEqual([{ n: 1 }, { n: 2 }]);
    await closeTaskRows(rows);
  });

  it("refuse a line that is not UTF-8 (a Latin-1 export), naming it, rather than send its text with U+FFFD in place of what it held", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, Buffer.concat([Buffer.from('{"id":"a","task":{"q":"\u00ef\u00bf\u00bd"}}\n', "latin1"), Buffer.from('{"id":"b","task":{"q":"caf'), Buffer.from([0xe9]), Buffer.from('"}}\n')]));
    await expect(readTaskRows(path)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:2: not UTF-8`) });
    // A U+FFFD written as such is text like any other.
    await writeFile(path, '{"id":"a","task":{"q":"\uFFFD \u00e9"}}\n');
    const rows = await readTaskRows(path);
    expect(await loadTask(rows[0]!)).toEqual({ q: "\uFFFD \u00e9" });
    await closeTaskRows(rows);
  });

  it.each([
    ["names a key twice (JSON.parse would keep the last)", '{"id":"a","task":{"seed":1,"seed":2}}', 'names key "seed" twice'],
    ["holds an integer a double rounds", '{"id":"a","task":{"seed":9007199254740993}}', "holds integer 9007199254740993"],
    ["nests deeper than a /run body may carry it", `{"id":"a","task":{"x":${"[".repeat(127)}${"]".repeat(127)}}}`, "the task nests more than 127 levels deep"],
  ])("refuse a line that %s, naming it, rather than send another task", async (_why, line, detail) => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, `{"id":"ok","task":{"n":1}}\n${line}\n`);
    await expect(readTaskRows(path)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:2: ${detail}`) });
  });

  it("with an id prefix, every row's rollout id starts with it, written ids and row-<line> alike", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, `{"id":"q1","task":{"n":1}}\n\n{"n":2}\n`);
    expect((await readTaskRowsClosed(path, { idPrefix: "run2." })).map((r) => r.rolloutId)).toEqual(["run2.q1", "run2.row-3"]);
    expect((await readTaskRowsClosed(path)).map((r) => r.rolloutId)).toEqual(["q1", "row-3"]);
  });

  it("with an id prefix, a row whose whole id is no rollout id (too long) is refused naming its line", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, `{"id":"${"q".repeat(195)}","task":{}}\n`);
    expect(await readTaskRowsClosed(path, { idPrefix: "run1." })).toHaveLength(1);
    await expect(readTaskRows(path, { idPrefix: "run12." })).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:1: `) });
  });

  it("take a task nested as deep as a /run body can carry", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, `{"id":"a","task":{"x":${"[".repeat(126)}${"]".repeat(126)}}}\n`);
    expect(await readTaskRowsClosed(path)).toHaveLength(1);
  });

  it("a read the storage refuses (EIO) is storage_error naming the file, not invalid_request: the flag is fine", async () => {
    // Reading /proc/self/mem from offset 0 fails with EIO, as a failing disk's read would.
    const error = await readTaskRows("/proc/self/mem").then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(toCheckpointError(error)).toMatchObject({ code: "storage_error", message: expect.stringMatching(/^EIO: .*'\/proc\/self\/mem'$/) });
  });
});

describe("readTaskRows progress", () => {
  it("tells the rows read and their bytes as it goes (a read of millions of rows takes minutes), and nothing for a read shorter than its interval", async () => {
    const path = join(dir, "progress.jsonl");
    const lines = Array.from({ length: 5 }, (_, i) => `{"id":"r${i}","task":{"n":${i}}}`);
    await writeFile(path, `${lines.join("\n")}\n`);
    const told: [number, number][] = [];
    await readTaskRowsClosed(path, { onProgress: (rows, bytes) => told.push([rows, bytes]), progressEveryMs: 0 });
    // Before each line: the rows before it and the bytes up to its start.
    const starts = lines.map((_, i) => lines.slice(0, i).reduce((sum, line) => sum + line.length + 1, 0));
    expect(told).toEqual(starts.map((bytes, i) => [i, bytes]));
    const quiet: unknown[] = [];
    await readTaskRowsClosed(path, { onProgress: (...args) => quiet.push(args) });
    expect(quiet).toEqual([]);
  });
});
