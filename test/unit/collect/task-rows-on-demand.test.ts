import { execFileSync } from "node:child_process";
import { statSync } from "node:fs";
import { mkdtemp, readFile, rename, rm, truncate, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { TaskFile } from "../../../coordinator/collect/task-file.js";
import { TaskLineRef, closeTaskRows, loadTask, readTaskRows, type TaskRow } from "../../../coordinator/collect/task-rows.js";
import { MAX_JSON_DEPTH } from "../../../protocol/index.js";
import { descriptorsOn, openDescriptors } from "../../support/open-descriptors.js";

/**
 * A regular tasks file's rows hold where each task's line is, not the task: read again (and
 * checked unchanged) when the row is sent, through the one descriptor opened at start-up. Held
 * parsed, 500,000 tasks of 8 KB filled Node's default heap (docs/benchmarks.md, `collect-task-memory`).
 */
let dir: string;
/** Every read's rows, closed after the test: each holds its file open. */
const read: TaskRow[][] = [];
const readRows = async (...args: Parameters<typeof readTaskRows>) => {
  const rows = await readTaskRows(...args);
  read.push(rows);
  return rows;
};
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-task-lines-"));
});
afterEach(async () => {
  for (const rows of read.splice(0)) await closeTaskRows(rows);
  await rm(dir, { recursive: true, force: true });
});

const bigTask = (i: number) => ({ prompt: "x".repeat(8000), n: i });

describe("task rows read from a regular file", () => {
  it("hold a few hundred bytes per row whatever a task's size, not the task", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, Array.from({ length: 50 }, (_, i) => JSON.stringify({ id: `t${i}`, task: bigTask(i) })).join("\n") + "\n");
    const rows = await readRows(path);
    expect(rows).toHaveLength(50);
    // What a row keeps, as bytes: 8 KB of task each before, when every row held its task parsed.
    const held = rows.map((row) => JSON.stringify(row).length);
    expect(Math.max(...held)).toBeLessThan(512);
    expect(await loadTask(rows[49]!)).toEqual(bigTask(49));
  });

  it("give back each task as validated: bare or with its id, after CRLF and blank lines, in any script", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"q":"été 🚀"}\r\n\n{"id":"named","task":{"q":"二","id":1}}\n{"task":3,"other":1}');
    const rows = await readRows(path, { idPrefix: "p." });
    expect(rows.map((r) => r.rolloutId)).toEqual(["p.row-1", "p.named", "p.row-4"]);
    expect(await Promise.all(rows.map(loadTask))).toEqual([{ q: "été 🚀" }, { q: "二", id: 1 }, { task: 3, other: 1 }]);
  });

  it("give back the task a row held in memory would have sent, through the same schema (a FIFO's rows hold theirs)", async () => {
    const path = join(dir, "tasks.jsonl");
    const text = '{"id":"a","task":{"__proto__":{"x":1},"y":2}}\n';
    await writeFile(path, text);
    const [row] = await readRows(path);
    const fifo = join(dir, "tasks.fifo");
    execFileSync("mkfifo", [fifo]);
    const reading = readRows(fifo);
    await writeFile(fifo, text);
    const [held] = await reading;
    expect(held!.task).not.toBeInstanceOf(TaskLineRef);
    expect(JSON.stringify(await loadTask(row!))).toBe(JSON.stringify(held!.task));
  });

  it("send a task's __proto__ key as written and count its nesting", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"id":"a","task":{"__proto__":{"x":1},"y":2}}\n{"__proto__":[1],"q":"bare"}\n');
    const rows = await readRows(path);
    expect((await Promise.all(rows.map(loadTask))).map((task) => JSON.stringify(task))).toEqual(['{"__proto__":{"x":1},"y":2}', '{"__proto__":[1],"q":"bare"}']);
    let deep = "1";
    for (let i = 0; i < MAX_JSON_DEPTH - 1; i++) deep = `[${deep}]`; // with the task object, MAX_JSON_DEPTH levels
    await writeFile(path, `{"id":"c","task":{"__proto__":${deep}}}\n`);
    await expect(readRows(path)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("nests more than") });
  });

  it("refuse a line changed, cut off or gone since it was read (invalid_request), never sending another task", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"id":"a","task":{"n":1}}\n{"id":"b","task":{"n":2}}\n');
    const rows = await readRows(path);
    // Same length, other content: only the digest tells.
    await writeFile(path, '{"id":"a","task":{"n":7}}\n{"id":"b","task":{"n":2}}\n');
    await expect(loadTask(rows[0]!)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:1: changed since`) });
    expect(await loadTask(rows[1]!)).toEqual({ n: 2 });
    await truncate(path, 30);
    await expect(loadTask(rows[1]!)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:2: changed since`) });
    // Removed, the file opened at start-up is still read: as it was cut.
    await unlink(path);
    await expect(loadTask(rows[1]!)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:2: changed since`) });
  });

  // The line's digest is of its text as decoded: bytes edited in place into a sequence that is not
  // UTF-8 but decodes to the same text (U+FFFD) passed the check, and the task was sent as validated
  // though the file no longer held it. Before, loadTask gave back { q: "\uFFFDx" }.
  it("refuse a line edited in place into bytes that are not UTF-8, even ones decoding to the text validated, naming the line", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"id":"a","task":{"q":"\uFFFDx"}}\n');
    const rows = await readRows(path);
    const bytes = await readFile(path);
    const at = bytes.indexOf(Buffer.from([0xef, 0xbf, 0xbd]));
    // A truncated 4-byte sequence: one U+FFFD, as the 3 bytes of a written U+FFFD decode to.
    await writeFile(path, Buffer.concat([bytes.subarray(0, at), Buffer.from([0xf0, 0x90, 0x80]), bytes.subarray(at + 3)]));
    await expect(loadTask(rows[0]!)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`${path}:1: not UTF-8 text`) });
  });

  it("give back the tasks read at start-up when the file is replaced (mv) or removed: the file opened then is read, not the path", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"id":"a","task":{"n":1}}\n{"id":"b","task":{"n":2}}\n{"id":"c","task":{"n":3}}\n');
    const rows = await readRows(path);
    const next = join(dir, "next.jsonl");
    await writeFile(next, '{"id":"a","task":{"n":7}}\n{"id":"b","task":{"n":8}}\n{"id":"c","task":{"n":9}}\n');
    await rename(next, path);
    expect(await Promise.all(rows.slice(0, 2).map(loadTask))).toEqual([{ n: 1 }, { n: 2 }]);
    await unlink(path);
    expect(await loadTask(rows[2]!)).toEqual({ n: 3 });
  });

  it("read every line through the one descriptor opened at start-up: loads at once open none", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, Array.from({ length: 200 }, (_, i) => JSON.stringify({ id: `t${i}`, task: { n: i } })).join("\n"));
    const opened = statSync(path);
    const rows = await readRows(path);
    expect(descriptorsOn(opened)).toBe(1);
    await loadTask(rows[0]!); // warm-up: whatever the first load loads stays open (none of ours)
    const before = openDescriptors();
    let most = before;
    let settled = false;
    const loads = Promise.all(rows.map(loadTask)).finally(() => (settled = true));
    // Looked at between the loads' steps (an open by path shows while the threadpool holds it).
    while (!settled) {
      most = Math.max(most, openDescriptors());
      await new Promise((resolve) => setImmediate(resolve));
    }
    expect((await loads).map((task) => task["n"])).toEqual(rows.map((_, i) => i));
    expect(most).toBe(before);
    expect(descriptorsOn(opened)).toBe(1);
  });

  it("let go of their file once closed (closing again is a no-op), refusing a load after it; a read refused or rowless holds none", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"id":"a","task":{"n":1}}\n');
    const opened = statSync(path);
    const rows = await readRows(path);
    expect(descriptorsOn(opened)).toBe(1);
    await closeTaskRows(rows);
    await closeTaskRows(rows);
    expect(descriptorsOn(opened)).toBe(0);
    // Not an unreadable --tasks (invalid_request, exit 2): rows used past their collector.
    await expect(loadTask(rows[0]!)).rejects.toMatchObject({ code: "invalid_phase", message: expect.stringMatching(/closed its tasks file/) });
    const bad = join(dir, "bad.jsonl");
    await writeFile(bad, '{"id":"a","task":{"n":1}}\nnot json\n');
    await expect(readRows(bad)).rejects.toMatchObject({ code: "invalid_request" });
    expect(descriptorsOn(statSync(bad))).toBe(0);
    const empty = join(dir, "empty.jsonl");
    await writeFile(empty, "\n\n");
    expect(await readRows(empty)).toEqual([]);
    expect(descriptorsOn(statSync(empty))).toBe(0);
  });

  it("hold no descriptor once a refused read has rejected: the read stream's own is closed before, not after", async () => {
    // Its close came after the rejection (fs.close runs on the thread pool): a handful of 100 reads held one then.
    let held = 0;
    for (let i = 0; i < 100; i++) {
      const bad = join(dir, `bad-${i}.jsonl`);
      await writeFile(bad, '{"id":"a","task":{"n":1}}\nnot json\n');
      await expect(readRows(bad)).rejects.toMatchObject({ code: "invalid_request" });
      held += descriptorsOn(statSync(bad));
    }
    expect(held).toBe(0);
  });

  it("refuse a file that is not the one the start-up read opened (replaced between the two opens), holding nothing open", async () => {
    const path = join(dir, "tasks.jsonl");
    const other = join(dir, "other.jsonl");
    await writeFile(path, '{"id":"a","task":{"n":1}}\n');
    await writeFile(other, '{"id":"a","task":{"n":2}}\n');
    await expect(TaskFile.openAs(path, statSync(other))).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(`tasks file ${path} was replaced while it was being opened`) });
    expect(descriptorsOn(statSync(path))).toBe(0);
    const file = await TaskFile.openAs(path, statSync(path));
    expect((await file.read(0, 25)).toString()).toBe('{"id":"a","task":{"n":1}}');
    await file.close();
  });
});
