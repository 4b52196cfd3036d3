import { readdir } from "node:fs/promises";
import { fileURLToPath, pathToFileURL } from "node:url";
import { dirname, join } from "node:path";

/**
 * `npm run bench [-- name…]`: runs every benchmark module in bench/ (or those whose file name
 * contains one of the given names). Each module exports `run()` and writes its own section of
 * docs/benchmarks.md.
 */
const here = dirname(fileURLToPath(import.meta.url));
const wanted = process.argv.slice(2);
const files = (await readdir(here)).filter((f) => f.endsWith(".js") && f !== "run-all.js" && !f.startsWith("bench-"));
const selected = files.filter((f) => wanted.length === 0 || wanted.some((w) => f.includes(w))).sort();
if (selected.length === 0) {
  console.error(`no benchmark matches ${wanted.join(", ")}; available: ${files.map((f) => f.replace(/\.js$/, "")).join(", ")}`);
  process.exit(2);
}
for (const file of selected) {
  console.log(`\n=== ${file.replace(/\.js$/, "")} ===`);
  const module = (await import(pathToFileURL(join(here, file)).href)) as { run?: () => Promise<void> };
  if (typeof module.run !== "function") throw new Error(`${file} does not export run()`);
  await module.run();
}
