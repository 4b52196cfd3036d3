import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { readTaskRows } from "../../../coordinator/collect/task-rows.js";
import { readTaskRowsClosed } from "../../support/task-rows-closed.js";
import { readTaskFile } from "../../../participants/replay/task-file.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-task-cap-"));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

/**
 * A task line is held only up to the longest string Node decodes (512 MiB; smaller here). Read with
 * readline, a longer one threw V8's RangeError ("Invalid string length") out of the file stream's
 * data handler: an uncaught exception that ended the process (`gym-ckpt collect --tasks`, `replay
 * seeds --tasks`) with a stack trace, after holding 600+ MiB.
 */
describe("a tasks line longer than any task line can be", () => {
  const content = () => `{"id":"a","task":{"n":1}}\r\n{"id":"b","task":{"s":"${"x".repeat(4096)}"}}\n{"id":"c","task":{"n":3}}\n`;

  it("is invalid_request naming file:line for collect --tasks, as soon as the limit is passed", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, content());
    await expect(readTaskRows(path, { maxLineBytes: 1024 })).rejects.toMatchObject({
      code: "invalid_request",
      message: `${path}:2: longer than any task line can be (over 1024 bytes without a newline)`,
    });
    // The same without a newline at the end (the final line), and every line within the limit reads as before.
    await writeFile(path, content().slice(0, -1));
    await expect(readTaskRowsClosed(path, { maxLineBytes: 8192 })).resolves.toHaveLength(3);
    await writeFile(path, `{"id":"a","task":{"s":"${"x".repeat(4096)}"}}`);
    await expect(readTaskRows(path, { maxLineBytes: 1024 })).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:1: longer than`) });
  });

  it("is invalid_request naming file:line for replay seeds --tasks", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, content());
    await expect(readTaskFile(path, 1024)).rejects.toMatchObject({
      code: "invalid_request",
      message: `${path}:2: longer than any task line can be (over 1024 bytes without a newline)`,
    });
    expect(await readTaskFile(path, 8192)).toEqual([{ n: 1 }, { s: "x".repeat(4096) }, { n: 3 }]);
  });
});
