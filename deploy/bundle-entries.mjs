// The build's second step (after tsc): every process entry, dist/**/main.js, is replaced by one
// file holding it and everything it imports, npm packages included. A process then loads one file
// instead of ~650 modules: Node 20's module loader was most of a process's start-up (0.5-0.7 s of
// CPU each), and the Gym, the CLI and the tests start many. The other compiled modules stay as they
// are, for the package's library entry points.
import { readFile, readdir } from "node:fs/promises";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const dist = join(dirname(fileURLToPath(import.meta.url)), "..", "dist");

/** dist's main.js files, the benchmarks' aside (they are run from dist as they are). */
async function entries() {
  const found = [];
  for (const top of ["coordinator", "participants"]) {
    for (const path of await readdir(join(dist, top), { recursive: true })) {
      if (path === "main.js" || path.endsWith(`${sep}main.js`)) found.push(join(dist, top, path));
    }
  }
  return found.sort();
}

/**
 * Each bundled module keeps its own location: `import.meta.url`, and a CommonJS package's
 * `__filename` and `__dirname`, become its original file's, relative to the bundle's URL (a bundle
 * has one URL for all its modules). Code finds the files beside it that way: the Gym's entries, the
 * `--import` preloads, a package's own data. Relative, so dist can still be moved as a whole.
 */
const OWN_LOCATION = /import\.meta\.url|(?<![\w$.])__(?:filename|dirname)(?![\w$])/g;

function ownLocation(entry) {
  return {
    name: "own-location",
    setup(b) {
      b.onLoad({ filter: /\.[cm]?js$/ }, async (args) => {
        const text = await readFile(args.path, "utf8");
        if (text.search(OWN_LOCATION) < 0) return undefined;
        // Through the banner's __bundleUrl: `import.meta` itself would make esbuild take a CommonJS file for an ES module.
        const url = `new URL(${JSON.stringify(relative(dirname(entry), args.path).split(sep).join("/"))}, __bundleUrl)`;
        const own = { "import.meta.url": `${url}.href`, __filename: `__bundlePath(${url})`, __dirname: `__bundleDirname(__bundlePath(${url}))` };
        return { contents: text.replace(OWN_LOCATION, (name) => own[name]), loader: "js", resolveDir: dirname(args.path) };
      });
    },
  };
}

/** Defines what CommonJS packages inside an ES module bundle use: `require` for Node's built-ins, and the helpers above. */
const BANNER = [
  'import { createRequire as __bundleRequire } from "node:module";',
  'import { fileURLToPath as __bundlePath } from "node:url";',
  'import { dirname as __bundleDirname } from "node:path";',
  "const __bundleUrl = import.meta.url;",
  "const require = __bundleRequire(__bundleUrl);",
].join(" ");

for (const entry of await entries()) {
  await build({
    entryPoints: [entry],
    outfile: entry,
    allowOverwrite: true,
    bundle: true,
    platform: "node",
    target: "node20",
    format: "esm",
    banner: { js: BANNER },
    plugins: [ownLocation(entry)],
    sourcemap: "linked",
    sourcesContent: false,
    logLevel: "error",
  });
}
