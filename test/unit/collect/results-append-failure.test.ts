import * as fsPromises from "node:fs/promises";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { appendResult, readResultsForAppend } from "../../../coordinator/collect/results-file.js";

// An append that fails part way (a full disk: the first chunks written, then ENOSPC) while
// `failLongAppend` is set: the real file gets the first half of the text, then the call rejects.
let failLongAppend = false;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  const appendFile = (async (path: string, data: string) => {
    if (failLongAppend && data.length > 1000) {
      await actual.appendFile(path, data.slice(0, data.length >> 1));
      throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });
    }
    return actual.appendFile(path, data);
  }) as typeof actual.appendFile;
  return withOverrides(actual, { appendFile });
});

let dir: string;
beforeEach(async () => {
  failLongAppend = false;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-results-"));
});
afterEach(() => fsPromises.rm(dir, { recursive: true, force: true }));

const line = (rollout_id: string, response: Record<string, unknown> = {}) => ({ rollout_id, attempt: 0, reward: 1, continued: false, finished_at: 1, response });

it("an append that failed part way leaves no fragment for the next append to land after (mid-file, where no start can read past it)", async () => {
  const out = join(dir, "results.jsonl");
  await appendResult(out, line("a"));
  failLongAppend = true;
  // b's long reply fails part way; c, queued behind it, still fits.
  const b = appendResult(out, line("b", { answer: "x".repeat(4000) }));
  const c = appendResult(out, line("c"));
  await expect(b).rejects.toMatchObject({ code: "ENOSPC" });
  await c;
  expect((await readFile(out, "utf8")).split("\n").filter(Boolean).map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id)).toEqual(["a", "c"]);
  expect([...(await readResultsForAppend(out)).keys()]).toEqual(["a", "c"]);
});
