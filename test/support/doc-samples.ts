import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root: the package an outside user's code imports as `gym-ckpt/…`. */
export const PACKAGE_ROOT = fileURLToPath(new URL("../..", import.meta.url));

/**
 * The TypeScript samples in docs/ that have imports, in page order (a sample without imports is a
 * fragment of prose, not a program).
 */
export function docSamples(): { doc: string; code: string }[] {
  const docs = join(PACKAGE_ROOT, "docs");
  return readdirSync(docs)
    .filter((name) => name.endsWith(".md"))
    .flatMap((name) => [...readFileSync(join(docs, name), "utf8").matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((m) => ({ doc: name, code: m[1]! })))
    .filter((s) => /^import /m.test(s.code));
}
