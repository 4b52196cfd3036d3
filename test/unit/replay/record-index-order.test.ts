/**
 * Reference (rollout replay §4): records are published first, then their index, so an index never
 * references bytes that are not there yet; the step's marker comes last. The order is read from the
 * filesystem calls that put each file in place (a record file is hard-linked, an index and a marker
 * renamed), and a records publication that fails leaves no index behind.
 */
import path from "node:path";
import { readdir } from "node:fs/promises";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { writeRolloutRecords, writeStepRecords } from "../../../participants/replay/index.js";
import { linearTrace, tempDir, traceId } from "./fixtures.js";

const placed = vi.hoisted(() => ({ names: [] as string[], failLink: undefined as string | undefined }));
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const original = await importOriginal<typeof import("node:fs/promises")>();
  const link = async (from: Parameters<typeof original.link>[0], to: Parameters<typeof original.link>[1]) => {
    if (placed.failLink === path.basename(String(to))) {
      placed.failLink = undefined;
      throw Object.assign(new Error(`ENOSPC: no space left on device, link '${String(to)}'`), { code: "ENOSPC", syscall: "link" });
    }
    await original.link(from, to);
    placed.names.push(path.basename(String(to)));
  };
  const rename = async (from: Parameters<typeof original.rename>[0], to: Parameters<typeof original.rename>[1]) => {
    await original.rename(from, to);
    placed.names.push(path.basename(String(to)));
  };
  return withOverrides(original, { link, rename });
});

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => {
  ({ dir, cleanup } = await tempDir());
  placed.names.length = 0;
});
afterEach(() => cleanup());

describe("records before their index", () => {
  it("each env's record file is in place before its index, and every file before the step's markers", async () => {
    const envs = ["alpha", "beta", "gamma"];
    await writeStepRecords(dir, 1, [
      ...envs.map((env, i) => ({ kind: "train" as const, env, traces: [linearTrace(traceId(i + 1))] })),
      { kind: "eval", env: "alpha", traces: [linearTrace(traceId(9))] },
    ]);
    const pairs: [string, string][] = [...envs.map((e): [string, string] => [`train_rollouts_${e}.jsonl`, `index_train_${e}.jsonl`]), ["eval_rollouts_alpha.jsonl", "index_eval_alpha.jsonl"]];
    for (const [record, index] of pairs) {
      expect(placed.names).toContain(record);
      expect(placed.names.indexOf(record)).toBeLessThan(placed.names.indexOf(index));
    }
    const firstMarker = placed.names.findIndex((n) => n.startsWith("_complete_"));
    expect(placed.names.slice(firstMarker).every((n) => n.startsWith("_complete_"))).toBe(true);
  });

  it("a record file whose publication fails (a full disk) leaves no index; the retry publishes both", async () => {
    placed.failLink = "train_rollouts_gsm8k.jsonl";
    const batch = { kind: "train" as const, env: "gsm8k", traces: [linearTrace(traceId(1))] };
    await expect(writeRolloutRecords(dir, 2, batch)).rejects.toThrow(/ENOSPC/);
    expect(await readdir(path.join(dir, "step_2"))).toEqual([]);
    await writeRolloutRecords(dir, 2, batch);
    expect((await readdir(path.join(dir, "step_2"))).sort()).toEqual(["index_train_gsm8k.jsonl", "train_rollouts_gsm8k.jsonl"]);
  });
});
