import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * The TypeScript samples in docs/ with imports compile as an outside user's code would: strict,
 * importing the package (`gym-ckpt/…`) through its exports and type declarations. A sample that is
 * a fragment (no imports) is prose and not checked.
 */
const ROOT = fileURLToPath(new URL("../..", import.meta.url));
// Inside the package (.tmp/ is gitignored), so `gym-ckpt/…` resolves by self-reference to dist/.
const WORK = join(ROOT, ".tmp", `doc-samples-${process.pid}`);
beforeAll(() => ensureBuilt());
afterAll(() => rmSync(WORK, { recursive: true, force: true }));

function samples(): { doc: string; code: string }[] {
  const docs = join(ROOT, "docs");
  return readdirSync(docs)
    .filter((name) => name.endsWith(".md"))
    .flatMap((name) => [...readFileSync(join(docs, name), "utf8").matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => ({ doc: name, code: m[1]! })))
    .filter((s) => /^import /m.test(s.code));
}

describe("docs samples", () => {
  it("every sample with imports type-checks (strict) against the built package", { timeout: 120_000 }, () => {
    const found = samples();
    expect(found.map((s) => s.doc).sort()).toEqual(expect.arrayContaining(["api.md", "gym.md", "resources.md"]));
    mkdirSync(WORK, { recursive: true });
    const files = found.map((s, i) => {
      const file = join(WORK, `${s.doc.replace(".md", "")}-${i}.ts`);
      writeFileSync(file, `${s.code}\nexport {};\n`);
      return file;
    });
    const tsc = join(ROOT, "node_modules", "typescript", "bin", "tsc");
    const args = ["--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "--skipLibCheck", ...files];
    let output = "";
    try {
      execFileSync(process.execPath, [tsc, ...args], { cwd: ROOT, encoding: "utf8", stdio: "pipe" });
    } catch (error) {
      output = String((error as { stdout?: string }).stdout ?? error);
    }
    expect(output).toBe("");
  });
});
