import * as fsPromises from "node:fs/promises";
import { writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { toCheckpointError } from "../../../protocol/index.js";
import { ReplayTaskSource, writeStepRecords, type ReplayTask } from "../../../participants/replay/index.js";
import { linearTrace, mathSource, silent, tempDir, traceId, type MathTask } from "./fixtures.js";

// Opening a step marker fails with `failOpen` while it is set (an account without read permission,
// an I/O error: root in CI reads anything, so `open` is wrapped).
let failOpen: string | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  const open = ((file: string, ...rest: unknown[]) =>
    failOpen !== undefined && /\/_complete_(train|eval)\.json$/.test(String(file))
      ? Promise.reject(Object.assign(new Error(`${failOpen}: refused, open '${file}'`), { code: failOpen, errno: -13, syscall: "open", path: file }))
      : (actual.open as (...a: unknown[]) => unknown)(file, ...rest)) as typeof actual.open;
  return withOverrides(actual, { open });
});

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => {
  failOpen = undefined;
  ({ dir, cleanup } = await tempDir());
});
afterEach(() => cleanup());

const rollouts = () => path.join(dir, "run", "rollouts");
const names = (tasks: readonly ReplayTask[]) => tasks.map((t) => t.name);

function follower() {
  return new ReplayTaskSource<MathTask, string, number>(
    { records: "run/rollouts/step_*/train_rollouts_gsm8k.jsonl", source: { id: "gsm8k" }, mode: "recheck", wait_for_step_marker: true },
    mathSource(),
    { cwd: dir, logger: silent },
  );
}

/**
 * docs/replay.md (follow mode): a file the storage refuses to read refuses the reload, so the
 * operator hears of it; only a path that is not there matches nothing. A step marker the storage
 * refused (EACCES: a collector running with umask 077) was taken for an absent one: the follower
 * waited at that step for ever, serving nothing and saying nothing, where a follower that does not
 * wait for markers reported the same storage's refusal of the record files.
 */
describe("wait_for_step_marker: a step marker the storage refuses to read", () => {
  it.each(["EACCES", "EIO"])("%s refuses the reload (storage_error), changing nothing; the next reload that can read it goes on", async (code) => {
    await writeStepRecords(rollouts(), 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] }]);
    const source = follower();
    failOpen = code;
    const error = await source.reload().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(toCheckpointError(error)).toMatchObject({ code: "storage_error", message: expect.stringContaining("_complete_train.json") });
    expect(source.size).toBe(0);
    failOpen = undefined;
    await source.reload();
    expect(names(source.tasks)).toEqual(["recheck:00000001"]);
  });

  it("a marker that is not there, or is no marker (not JSON), still only makes the step wait", async () => {
    await writeStepRecords(rollouts(), 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] }]);
    const marker = path.join(rollouts(), "step_1", "_complete_train.json");
    await writeFile(marker, "not json");
    const source = follower();
    expect((await source.reload()).added).toBe(0);
    await fsPromises.rm(marker);
    expect((await source.reload()).added).toBe(0);
    await writeStepRecords(rollouts(), 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] }]);
    expect((await source.reload()).added).toBe(1);
  });
});
