import * as fsPromises from "node:fs/promises";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { appendResult, readResultsForAppend } from "../../../coordinator/collect/results-file.js";

// An append that fails part way (the first half written, then EIO) while `failLongAppend` is set,
// and a truncate that fails while `failTruncates` > 0 (each failure counts one down).
let failLongAppend = false;
let failTruncates = 0;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  const appendFile = (async (path: string, data: string) => {
    if (failLongAppend && data.length > 1000) {
      await actual.appendFile(path, data.slice(0, data.length >> 1));
      throw Object.assign(new Error("EIO: i/o error, write"), { code: "EIO", syscall: "write" });
    }
    return actual.appendFile(path, data);
  }) as typeof actual.appendFile;
  const truncate = (async (path: string, len?: number) => {
    if (failTruncates > 0) {
      failTruncates--;
      throw Object.assign(new Error("EIO: i/o error, ftruncate"), { code: "EIO", syscall: "ftruncate" });
    }
    return actual.truncate(path, len);
  }) as typeof actual.truncate;
  return withOverrides(actual, { appendFile, truncate });
});

let dir: string;
beforeEach(async () => {
  failLongAppend = false;
  failTruncates = 0;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-results-cut-"));
});
afterEach(() => fsPromises.rm(dir, { recursive: true, force: true }));

const line = (rollout_id: string, response: Record<string, unknown> = {}) => ({ rollout_id, attempt: 0, reward: 1, continued: false, finished_at: 1, response });

it("an append that failed part way and whose cut failed too: the fragment is cut before the next append, never left mid-file", async () => {
  const out = join(dir, "results.jsonl");
  await appendResult(out, line("a"));
  failLongAppend = true;
  failTruncates = 1;
  // b's long reply fails part way and its cut fails; c, queued behind it, must not land after the fragment.
  const b = appendResult(out, line("b", { answer: "x".repeat(4000) }));
  const c = appendResult(out, line("c")).catch((error: unknown) => error);
  await expect(b).rejects.toMatchObject({ code: "EIO" });
  await c;
  // Whatever c did, the next start must be able to read the file (only a torn last line is ignored).
  const rows = await readResultsForAppend(out);
  expect(rows.has("a")).toBe(true);
  expect(rows.has("b")).toBe(false);
  expect(rows.has("c")).toBe(true); // its own cut of the fragment succeeded: appended after it
  const text = await readFile(out, "utf8");
  expect(text.includes("xxxx")).toBe(false);
});
