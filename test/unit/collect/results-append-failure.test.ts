import * as fsPromises from "node:fs/promises";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { appendResult, appendResultText, readResultsForAppend, resultLineText, resultWriteUnderWay } from "../../../coordinator/collect/results-file.js";

// An append that fails part way (a full disk: the first chunks written, then ENOSPC) while
// `failLongAppend` is set: the real file gets the first half of the text, then the call rejects.
let failLongAppend = false;
// The size an append reads before its write (to cut a failed write back) held while `statHeld` is
// set, as on a mount that hangs: the stat waits until the test lets it go.
let statHeld: { release: () => void; reached: () => void } | undefined;
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
  const stat = (async (path: string) => {
    const held = statHeld;
    if (held) {
      held.reached();
      await new Promise<void>((resolve) => (held.release = resolve));
    }
    return actual.stat(path);
  }) as typeof actual.stat;
  return withOverrides(actual, { appendFile, stat });
});

let dir: string;
beforeEach(async () => {
  failLongAppend = false;
  statHeld = undefined;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-results-"));
});
afterEach(() => fsPromises.rm(dir, { recursive: true, force: true }));

const line = (rollout_id: string, response: Record<string, unknown> = {}) => ({ rollout_id, attempt: 0, reward: 1, continued: false, finished_at: 1, response });
const idsIn = async (out: string) => (await readFile(out, "utf8")).split("\n").filter(Boolean).map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id);

it("an append that failed part way leaves no fragment for the next append to land after (mid-file, where no start can read past it)", async () => {
  const out = join(dir, "results.jsonl");
  await appendResult(out, line("a"));
  failLongAppend = true;
  // b's long reply fails part way; c, queued behind it, still fits.
  const b = appendResult(out, line("b", { answer: "x".repeat(4000) }));
  const c = appendResult(out, line("c"));
  await expect(b).rejects.toMatchObject({ code: "ENOSPC" });
  await c;
  expect(await idsIn(out)).toEqual(["a", "c"]);
  expect([...(await readResultsForAppend(out)).keys()]).toEqual(["a", "c"]);
});

it("an append given up while its size read hangs (its write not begun) never writes its line once that read returns", async () => {
  const out = join(dir, "results.jsonl");
  await appendResult(out, line("a"));
  let reached!: () => void;
  const atStat = new Promise<void>((resolve) => (reached = resolve));
  statHeld = { release: () => undefined, reached };
  const givenUp = new AbortController();
  const b = appendResultText(out, resultLineText(line("b")), givenUp.signal);
  b.catch(() => undefined);
  await atStat;
  // Its write has not begun: the writer's lock may go, so the line must never land after this.
  expect(resultWriteUnderWay(out)).toBe(false);
  givenUp.abort(new Error("given up"));
  const held = statHeld;
  statHeld = undefined;
  held.release();
  await expect(b).rejects.toThrow("given up");
  expect(await idsIn(out)).toEqual(["a"]);
});
