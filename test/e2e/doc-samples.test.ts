import { spawnSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { docSamples, PACKAGE_ROOT } from "../support/doc-samples.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * The TypeScript samples in docs/ with imports compile as an outside user's code would: strict,
 * importing the package (`gym-ckpt/…`) through its exports and type declarations. A sample that is
 * a fragment (no imports) is prose and not checked.
 */
// Inside the package (.tmp/ is gitignored), so `gym-ckpt/…` resolves by self-reference to dist/.
const WORK = join(PACKAGE_ROOT, ".tmp", `doc-samples-${process.pid}`);
beforeAll(() => ensureBuilt());
afterAll(() => rmSync(WORK, { recursive: true, force: true }));

describe("docs samples", () => {
  it("every sample with imports type-checks (strict) against the built package", { timeout: 120_000 }, () => {
    const found = docSamples();
    expect(found.map((s) => s.doc).sort()).toEqual(expect.arrayContaining(["api.md", "gym.md", "resources.md"]));
    mkdirSync(WORK, { recursive: true });
    const files = found.map((s, i) => {
      const file = join(WORK, `${s.doc.replace(".md", "")}-${i}.ts`);
      writeFileSync(file, `${s.code}\nexport {};\n`);
      return file;
    });
    const tsc = join(PACKAGE_ROOT, "node_modules", "typescript", "bin", "tsc");
    const args = ["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "--skipLibCheck", ...files];
    // Its exit status and both streams: a tsc that did not run (or died) prints nothing on stdout.
    const tscRun = spawnSync(process.execPath, [tsc, ...args], { cwd: PACKAGE_ROOT, encoding: "utf8" });
    expect({ status: tscRun.status, output: `${tscRun.stdout}${tscRun.stderr}`, error: tscRun.error?.message }).toEqual({ status: 0, output: "", error: undefined });
  });
});
