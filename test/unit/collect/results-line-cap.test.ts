import { appendFile, mkdtemp, readFile, rm, stat, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { appendResult, readResults, readResultsForAppend, type ResultLine } from "../../../coordinator/collect/results-file.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-results-cap-"));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

const result = (id: string, transcript = ""): ResultLine => ({ rollout_id: id, attempt: 0, reward: 1, continued: false, finished_at: 1, response: { transcript } });
const text = (id: string, transcript = "") => `${JSON.stringify(result(id, transcript))}\n`;

describe("results.jsonl appends: no line longer than a reader decodes", () => {
  it("refuses (payload_too_large) a line past the limit before appending anything, so the next start still reads the file", async () => {
    // A /run reply whose JSON grows when written again (`9E20` is 21 digits as JSON.stringify writes
    // it) can make a line past what any start-up reads, which then refused every start. Scaled down.
    const path = join(dir, "results.jsonl");
    await appendResult(path, result("a"), 1024);
    const before = await readFile(path, "utf8");
    await expect(appendResult(path, result("b", "x".repeat(4096)), 1024)).rejects.toMatchObject({
      code: "payload_too_large",
      message: expect.stringContaining("over the 1024-byte limit"),
    });
    expect(await readFile(path, "utf8")).toBe(before);
    await appendResult(path, result("c"), 1024);
    expect([...(await readResultsForAppend(path, 1024)).keys()]).toEqual(["a", "c"]);
  });
});

describe("results.jsonl at start-up: no line is held past the longest one a reader decodes", () => {
  it("cuts a torn tail longer than any line unread (a sparse 600 MiB tail: it was read whole and made a string, ERR_STRING_TOO_LONG)", async () => {
    const path = join(dir, "results.jsonl");
    await appendResult(path, result("a"));
    const end = (await stat(path)).size;
    await truncate(path, end + 600 * 2 ** 20); // sparse: NUL bytes without a newline, nothing written to disk
    const rows = await readResultsForAppend(path);
    expect([...rows.keys()]).toEqual(["a"]);
    expect((await stat(path)).size).toBe(end);
  });

  it("refuses a middle line longer than the limit (invalid_checkpoint_state naming file:line), changing nothing", async () => {
    const path = join(dir, "results.jsonl");
    const content = text("a") + text("b", "x".repeat(4096)) + text("c");
    await writeFile(path, content);
    await expect(readResultsForAppend(path, 1024)).rejects.toMatchObject({
      code: "invalid_checkpoint_state",
      message: `${path}:2: longer than any result line can be (over 1024 bytes without a newline)`,
    });
    await expect(readResults(path, 1024)).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining(`${path}:2:`) });
    expect(await readFile(path, "utf8")).toBe(content);
    // Within the limit, every line is read as before.
    expect([...(await readResultsForAppend(path, 8192)).keys()]).toEqual(["a", "b", "c"]);
  });

  it("cuts a torn tail longer than the limit unread; one within it that is a whole record keeps its row", async () => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, text("a"));
    await appendFile(path, text("b", "y".repeat(4096)).slice(0, -1)); // a whole record that lost its newline
    expect([...(await readResultsForAppend(path, 1024)).keys()]).toEqual(["a"]);
    expect(await readFile(path, "utf8")).toBe(text("a"));
    await appendFile(path, text("c").slice(0, -1));
    expect([...(await readResultsForAppend(path, 1024)).keys()]).toEqual(["a", "c"]);
    expect(await readFile(path, "utf8")).toBe(text("a") + text("c"));
  });
});
