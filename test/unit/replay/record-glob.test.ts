import fs from "node:fs";
import { mkdir, realpath, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { expandGlobs, isIndexFileName, naturalCompare, stepOfPath } from "../../../participants/replay/index.js";
import { expandGlobFiles, naturalSort } from "../../../participants/replay/record-glob.js";
import { tempDir } from "./fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

async function touch(...rel: string[]) {
  for (const r of rel) {
    await mkdir(path.dirname(path.join(dir, r)), { recursive: true });
    await writeFile(path.join(dir, r), "");
  }
}

describe("record globs", () => {
  it("sorts digit runs numerically", () => {
    const sorted = ["step_10/a", "step_9/a", "step_1/b", "step_1/a", "step_010/a", "step_2/a"].sort(naturalCompare);
    expect(sorted).toEqual(["step_1/a", "step_1/b", "step_2/a", "step_9/a", "step_010/a", "step_10/a"]);
    expect(naturalCompare("x99999999999999999999", "x100000000000000000000")).toBeLessThan(0);
    // naturalSort is that order, each name split once.
    const names = ["step_10/a", "step_9/a", "step_1/b", "a", "step_1/a", "step_010/a", "step_2/a", "x99999999999999999999", "x100000000000000000000", "step_", "step_02b", "step_2a"];
    expect(naturalSort(names)).toEqual([...names].sort(naturalCompare));
  });

  it("splits each listed name into its runs once per expansion, not at every comparison of the sort", async () => {
    const names = Array.from({ length: 1000 }, (_, i) => `train_rollouts_${(i * 7919) % 1000}.jsonl`);
    await touch(...names.map((name) => `rollouts/step_1/${name}`));
    const split = vi.spyOn(String.prototype, "split");
    try {
      expect(await expandGlobs(["rollouts/step_*/train_rollouts_*.jsonl"], dir)).toHaveLength(1000);
      // A follower expands at every poll, on the event loop: ~2 n log n splits took ~0.1 s at 10k files.
      expect(split.mock.calls.filter(([separator]) => separator instanceof RegExp).length).toBeLessThan(1500); // 1000 names; it was ~9,400
    } finally {
      split.mockRestore();
    }
  });

  it("expands *, ?, [..] and ** without dotfiles, deduplicating across patterns", async () => {
    await touch(
      "run/rollouts/step_10/train_rollouts_a.jsonl",
      "run/rollouts/step_9/train_rollouts_a.jsonl",
      "run/rollouts/step_9/eval_rollouts_a.jsonl",
      "run/rollouts/step_9/index_train_a.jsonl",
      "run/rollouts/step_9/.train_rollouts_a.jsonl.123.abc.tmp",
      "run/rollouts/.hidden/train_rollouts_a.jsonl",
      "run/other/deep/er/records.jsonl",
    );
    const rel = (files: string[]) => files.map((f) => path.relative(dir, f));
    expect(rel(await expandGlobs(["run/rollouts/step_*/*_rollouts_*.jsonl", "run/rollouts/step_9/train_rollouts_?.jsonl"], dir))).toEqual([
      "run/rollouts/step_9/eval_rollouts_a.jsonl",
      "run/rollouts/step_9/train_rollouts_a.jsonl",
      "run/rollouts/step_10/train_rollouts_a.jsonl",
    ]);
    expect(rel(await expandGlobs(["run/**/*.jsonl"], dir))).toEqual([
      "run/other/deep/er/records.jsonl",
      "run/rollouts/step_9/eval_rollouts_a.jsonl",
      "run/rollouts/step_9/index_train_a.jsonl",
      "run/rollouts/step_9/train_rollouts_a.jsonl",
      "run/rollouts/step_10/train_rollouts_a.jsonl",
    ]);
    expect(rel(await expandGlobs(["run/rollouts/step_[0-9]/train_*.jsonl"], dir))).toEqual(["run/rollouts/step_9/train_rollouts_a.jsonl"]);
    expect(await expandGlobs([path.join(dir, "missing/*/x.jsonl")], "/")).toEqual([]);
    expect(isIndexFileName("index_train_a.jsonl")).toBe(true);
    expect(isIndexFileName("train_rollouts_a.jsonl")).toBe(false);
    expect(stepOfPath("/r/step_12/train_rollouts_a.jsonl")).toBe(12);
    expect(stepOfPath("/r/records.jsonl")).toBeNull();
  });

  it("never descends through a linked directory on a wildcard, and lists a file reached by two paths once", { timeout: 5000 }, async () => {
    await touch("rollouts/step_1/train_rollouts_gsm8k.jsonl", "rollouts/step_2/train_rollouts_gsm8k.jsonl");
    await symlink("step_1", path.join(dir, "rollouts/latest"));
    await symlink(".", path.join(dir, "rollouts/loop"));
    await symlink(".", path.join(dir, "rollouts/again"));
    const rel = (files: string[]) => files.map((f) => path.relative(dir, f));
    const steps = ["rollouts/step_1/train_rollouts_gsm8k.jsonl", "rollouts/step_2/train_rollouts_gsm8k.jsonl"];
    // `latest/` would repeat step_1 outside any step directory; two self-links would never end.
    expect(rel(await expandGlobs(["rollouts/**/train_rollouts_*.jsonl"], dir))).toEqual(steps);
    expect(rel(await expandGlobs(["rollouts/*/train_rollouts_*.jsonl"], dir))).toEqual(steps);
    expect(rel(await expandGlobs(["rollouts/**"], dir))).toEqual(steps);
    // A link the pattern names literally is followed; the file it reaches again is listed once.
    expect(rel(await expandGlobs(["rollouts/latest/train_rollouts_gsm8k.jsonl"], dir))).toEqual(["rollouts/latest/train_rollouts_gsm8k.jsonl"]);
    expect(rel(await expandGlobs(["rollouts/step_*/train_rollouts_*.jsonl", "rollouts/latest/train_rollouts_gsm8k.jsonl"], dir))).toEqual([
      "rollouts/latest/train_rollouts_gsm8k.jsonl",
      "rollouts/step_2/train_rollouts_gsm8k.jsonl",
    ]);
    // A linked record file is still a match, but not a second copy of the same file.
    await mkdir(path.join(dir, "rollouts/step_3"));
    await symlink("../step_2/train_rollouts_gsm8k.jsonl", path.join(dir, "rollouts/step_3/train_rollouts_gsm8k.jsonl"));
    await symlink("../step_2/train_rollouts_gsm8k.jsonl", path.join(dir, "rollouts/step_3/eval_rollouts_gsm8k.jsonl"));
    expect(rel(await expandGlobs(["rollouts/step_*/*_rollouts_*.jsonl"], dir))).toEqual(steps);
  });
});

describe("a filesystem whose listing gives no entry types (DT_UNKNOWN)", () => {
  it("still lists a directory one of whose entries vanished while Node typed it (a temp file renamed into place)", async () => {
    await touch("rollouts/step_1/train_rollouts_a.jsonl", "rollouts/step_1/train_rollouts_b.jsonl");
    const step1 = path.join(dir, "rollouts", "step_1");
    // As Node's readdir({withFileTypes}) fails there: it lstat's each entry of unknown type itself,
    // and one gone by then rejects the whole listing with that entry's ENOENT.
    const real = fs.promises.readdir.bind(fs.promises);
    const readdir = vi.spyOn(fs.promises, "readdir").mockImplementation((async (target: string, options?: { withFileTypes?: boolean }) => {
      if (target === step1 && options?.withFileTypes) {
        const gone = path.join(step1, ".train_rollouts_c.jsonl.1.abc.tmp");
        throw Object.assign(new Error(`ENOENT: no such file or directory, lstat '${gone}'`), { code: "ENOENT", syscall: "lstat", path: gone });
      }
      return real(target, options as never);
    }) as never);
    try {
      // Before: [] — step_1 read as not there, so a follower could take a later step before it.
      expect((await expandGlobs(["rollouts/step_*/*.jsonl"], dir)).map((f) => path.relative(dir, f))).toEqual([
        "rollouts/step_1/train_rollouts_a.jsonl",
        "rollouts/step_1/train_rollouts_b.jsonl",
      ]);
    } finally {
      readdir.mockRestore();
    }
  });
});

describe("real paths", () => {
  it("are what realpath gives, through a linked working directory, a literal link and a linked file alike", async () => {
    await touch("data/rollouts/step_1/train_rollouts_a.jsonl", "data/rollouts/step_2/deep/train_rollouts_a.jsonl");
    await symlink("data", path.join(dir, "work"));
    await symlink("step_1", path.join(dir, "data/rollouts/latest"));
    await symlink("../step_1/train_rollouts_a.jsonl", path.join(dir, "data/rollouts/step_2/train_rollouts_b.jsonl"));
    const cwd = path.join(dir, "work");
    const files = await expandGlobFiles(["rollouts/step_*/*.jsonl", "rollouts/**/deep/*.jsonl", "rollouts/latest/*.jsonl", "./../work/rollouts/step_2/train_rollouts_b.jsonl"], cwd);
    for (const file of files) expect(file.real).toBe(await realpath(file.path));
    expect(files.map((f) => path.relative(dir, f.path))).toEqual([
      "work/rollouts/latest/train_rollouts_a.jsonl",
      "work/rollouts/step_2/deep/train_rollouts_a.jsonl",
    ]);
  });
});

describe("the directory relative globs resolve against", () => {
  it("is a path, not a pattern: brackets, ? and * in its name match only themselves", async () => {
    for (const base of ["exp[1]", "exp?", "run*", "odd[z-a]"]) {
      await touch(`${base}/rollouts/step_1/train_rollouts_a.jsonl`);
      await touch(`${base.replace(/[[\]?*-]/g, "")}/rollouts/step_1/train_rollouts_a.jsonl`); // what a pattern reading of the name could match
      const cwd = path.join(dir, base);
      expect(await expandGlobs(["rollouts/step_*/train_rollouts_*.jsonl"], cwd)).toEqual([path.join(cwd, "rollouts/step_1/train_rollouts_a.jsonl")]);
      // A leading .. climbs from it as a path too.
      expect(await expandGlobs(["../step_*/train_rollouts_a.jsonl"], path.join(cwd, "rollouts/step_1"))).toEqual([path.join(cwd, "rollouts/step_1/train_rollouts_a.jsonl")]);
    }
  });
});
