import * as fsPromises from "node:fs/promises";
import { mkdtemp, readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { appendResultText, resultLineText, resultWriteUnderWay } from "../../../coordinator/collect/results-file.js";

// The size an append reads before its write (to cut a failed write back) held while `statHeld` is
// set, as on a mount that hangs: the stat waits until the test lets it go.
let statHeld: { release: () => void; reached: () => void } | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  const stat = (async (path: string) => {
    const held = statHeld;
    if (held) {
      held.reached();
      await new Promise<void>((resolve) => (held.release = resolve));
    }
    return actual.stat(path);
  }) as typeof actual.stat;
  return withOverrides(actual, { stat });
});

let dir: string;
beforeEach(async () => {
  statHeld = undefined;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-results-"));
});
afterEach(() => fsPromises.rm(dir, { recursive: true, force: true }));

const text = (rollout_id: string) => resultLineText({ rollout_id, attempt: 0, reward: 1, continued: false, finished_at: 1, response: {} });

it("an append given up while its size read hangs (its write not begun) never writes its line once that read returns", async () => {
  const out = join(dir, "results.jsonl");
  await appendResultText(out, text("a"));
  let reached!: () => void;
  const atStat = new Promise<void>((resolve) => (reached = resolve));
  statHeld = { release: () => undefined, reached };
  const givenUp = new AbortController();
  const b = appendResultText(out, text("b"), givenUp.signal);
  b.catch(() => undefined);
  await atStat;
  // Its write has not begun: the writer's lock may go, so the line must never land after this.
  expect(resultWriteUnderWay(out)).toBe(false);
  givenUp.abort(new Error("given up"));
  const held = statHeld;
  statHeld = undefined;
  held.release();
  await expect(b).rejects.toThrow("given up");
  expect((await readFile(out, "utf8")).split("\n").filter(Boolean).map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id)).toEqual(["a"]);
});
