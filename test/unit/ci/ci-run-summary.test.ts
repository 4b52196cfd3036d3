import { execFile } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

/**
 * `.ci/run`'s closing line (`N passed, M failed`), which CI reads, against a real vitest run of
 * files that fail in every way a test file can: a failed test, a file that does not load, a
 * throwing beforeAll (its tests reported skipped) or afterAll (its test reported passed), and a
 * worker that died mid-file (its tests left pending, the file reported "passed"). Each broken file
 * counts as a failure of its own; none may vanish behind another file's failure.
 */
const ROOT = fileURLToPath(new URL("../../..", import.meta.url));

const FIXTURES: Record<string, string> = {
  "pass.test.ts": `import { test } from "vitest";\ntest("a", () => {});\ntest("b", () => {});\n`,
  "one-fails.test.ts": `import { test, expect } from "vitest";\ntest("good", () => {});\ntest("bad", () => expect(1).toBe(2));\n`,
  "no-load.test.ts": `import "./missing-module.js";\nimport { test } from "vitest";\ntest("never", () => {});\n`,
  "before-all.test.ts": `import { beforeAll, describe, test } from "vitest";\ndescribe("d", () => {\n  beforeAll(() => { throw new Error("setup broke"); });\n  test("y", () => {});\n  test("z", () => {});\n});\n`,
  "after-all.test.ts": `import { afterAll, test } from "vitest";\nafterAll(() => { throw new Error("teardown broke"); });\ntest("ok", () => {});\n`,
  "worker-dies.test.ts": `import { test } from "vitest";\ntest("dies", () => { process.kill(process.pid, "SIGKILL"); });\ntest("after", () => {});\n`,
};

let project: string;

beforeAll(() => {
  project = mkdtempSync(join(tmpdir(), "gym-ckpt-ci-run-"));
  mkdirSync(join(project, ".ci"));
  copyFileSync(join(ROOT, ".ci/run"), join(project, ".ci/run"));
  symlinkSync(join(ROOT, "node_modules"), join(project, "node_modules"));
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "ci-run-fixture", private: true, type: "module", scripts: { test: "vitest run" } }));
  writeFileSync(join(project, "vitest.config.ts"), `import { defineConfig } from "vitest/config";\nexport default defineConfig({ test: { include: ["t/**/*.test.ts"], pool: "forks", maxWorkers: 2 } });\n`);
  mkdirSync(join(project, "t"));
  for (const [name, text] of Object.entries(FIXTURES)) writeFileSync(join(project, "t", name), text);
});

afterAll(() => rmSync(project, { recursive: true, force: true }));

describe(".ci/run", () => {
  it("counts every file that failed without a failed test as one failure, a dead worker's file included", { timeout: 120_000 }, async () => {
    // The outer vitest's variables would tell the inner one it runs inside a worker.
    const env = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("VITEST")));
    const result = await new Promise<{ code: number | null; stdout: string }>((resolve) =>
      execFile("bash", [join(project, ".ci/run")], { cwd: project, env, timeout: 110_000, maxBuffer: 16 << 20 }, (error, stdout) =>
        resolve({ code: error ? ((error as { code?: number }).code ?? null) : 0, stdout }),
      ),
    );
    const last = result.stdout.trimEnd().split("\n").at(-1);
    // Passed: pass.test.ts's two, one-fails' "good", after-all's "ok". Failed: "bad", then one each
    // for no-load, before-all, after-all and worker-dies.
    expect(last).toBe("4 passed, 5 failed");
    expect(result.code).toBe(1);
  });
});
