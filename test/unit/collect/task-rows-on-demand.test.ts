import { execFileSync } from "node:child_process";
import { mkdtemp, rm, truncate, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { TaskLineRef, loadTask, readTaskRows } from "../../../coordinator/collect/task-rows.js";

/**
 * A regular tasks file's rows hold where each task's line is, not the task: read again (and
 * checked unchanged) when the row is sent. Held parsed, 500,000 tasks of 8 KB filled Node's default
 * heap (docs/benchmarks.md, `collect-task-memory`).
 */
let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-task-lines-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const bigTask = (i: number) => ({ prompt: "x".repeat(8000), n: i });

describe("task rows read from a regular file", () => {
  it("hold a few hundred bytes per row whatever a task's size, not the task", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, Array.from({ length: 50 }, (_, i) => JSON.stringify({ id: `t${i}`, task: bigTask(i) })).join("\n") + "\n");
    const rows = await readTaskRows(path);
    expect(rows).toHaveLength(50);
    // What a row keeps, as bytes: 8 KB of task each before, when every row held its task parsed.
    const held = rows.map((row) => JSON.stringify(row).length);
    expect(Math.max(...held)).toBeLessThan(512);
    expect(await loadTask(rows[49]!)).toEqual(bigTask(49));
  });

  it("give back each task as validated: bare or with its id, after CRLF and blank lines, in any script", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"q":"été 🚀"}\r\n\n{"id":"named","task":{"q":"二","id":1}}\n{"task":3,"other":1}');
    const rows = await readTaskRows(path, { idPrefix: "p." });
    expect(rows.map((r) => r.rolloutId)).toEqual(["p.row-1", "p.named", "p.row-4"]);
    expect(await Promise.all(rows.map(loadTask))).toEqual([{ q: "été 🚀" }, { q: "二", id: 1 }, { task: 3, other: 1 }]);
  });

  it("give back the task a row held in memory would have sent, through the same schema (a FIFO's rows hold theirs)", async () => {
    const path = join(dir, "tasks.jsonl");
    const text = '{"id":"a","task":{"__proto__":{"x":1},"y":2}}\n';
    await writeFile(path, text);
    const [row] = await readTaskRows(path);
    const fifo = join(dir, "tasks.fifo");
    execFileSync("mkfifo", [fifo]);
    const reading = readTaskRows(fifo);
    await writeFile(fifo, text);
    const [held] = await reading;
    expect(held!.task).not.toBeInstanceOf(TaskLineRef);
    expect(JSON.stringify(await loadTask(row!))).toBe(JSON.stringify(held!.task));
  });

  it("refuse a line changed, cut off or gone since it was read (invalid_request), never sending another task", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"id":"a","task":{"n":1}}\n{"id":"b","task":{"n":2}}\n');
    const rows = await readTaskRows(path);
    // Same length, other content: only the digest tells.
    await writeFile(path, '{"id":"a","task":{"n":7}}\n{"id":"b","task":{"n":2}}\n');
    await expect(loadTask(rows[0]!)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:1: changed since`) });
    expect(await loadTask(rows[1]!)).toEqual({ n: 2 });
    await truncate(path, 30);
    await expect(loadTask(rows[1]!)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:2: changed since`) });
    await unlink(path);
    await expect(loadTask(rows[1]!)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("does not exist") });
  });
});
