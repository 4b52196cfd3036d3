// The build's second step (after tsc): every process entry, dist/**/main.js, is replaced by one
// file holding it and everything it imports statically, npm packages included. A process then
// loads one file instead of ~650 modules: Node 20's module loader was most of a process's start-up
// (0.5-0.7 s of CPU each), and the Gym, the CLI and the tests start many. What an entry imports
// dynamically (the OpenTelemetry SDK and its exporters, loaded only when telemetry is on; the CLI's
// commands, loaded one at a time) goes to chunks beside it, `<entry>-*.js`: Node parses a whole
// file before running it, and a bundle holding all of it cost a CLI command twice the CPU. The
// other compiled modules stay as they are, for the package's library entry points.
import { readFile, readdir } from "node:fs/promises";
import { basename, dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const dist = join(dirname(fileURLToPath(import.meta.url)), "..", "dist");

/**
 * The CLI's entry stays as tsc wrote it. Node parses a whole file before running its first line,
 * ~0.3 s for a bundle, and this entry must install its SIGUSR1 and SIGTERM listeners first thing
 * (coordinator/cli/main.ts). The program it then imports is bundled in its place.
 */
const CLI_ENTRY = join(dist, "coordinator", "cli", "main.js");
const CLI_PROGRAM = join(dist, "coordinator", "cli", "program.js");

/** What to bundle: dist's main.js files but the CLI's, and the CLI's program (the benchmarks run from dist as they are). */
async function targets() {
  const found = [CLI_PROGRAM];
  for (const top of ["coordinator", "participants"]) {
    for (const path of await readdir(join(dist, top), { recursive: true })) {
      const file = join(dist, top, path);
      if ((path === "main.js" || path.endsWith(`${sep}main.js`)) && file !== CLI_ENTRY) found.push(file);
    }
  }
  return found.sort();
}

/**
 * The modules `entry` imports statically, itself included: a bundle its entry loads must leave them
 * out and import them from dist, so that the process has one instance of each (the CLI's entry and
 * `collect` share the signals it kept while the program loaded).
 */
async function staticGraph(entry, dynamicTarget) {
  const result = await build({
    entryPoints: [entry],
    bundle: true,
    write: false,
    metafile: true,
    platform: "node",
    format: "esm",
    logLevel: "error",
    plugins: [{ name: "stop-at-dynamic-target", setup: (b) => b.onResolve({ filter: /./ }, (args) => (join(args.resolveDir, args.path) === dynamicTarget ? { path: args.path, external: true } : undefined)) }],
  });
  return new Set(Object.keys(result.metafile.inputs).map((input) => join(process.cwd(), input)));
}

/** Imports of `shared` modules stay imports, of the same files, from wherever the bundle is. */
function leaveOut(shared, bundle) {
  return {
    name: "leave-out-shared",
    setup(b) {
      b.onResolve({ filter: /^\.\.?\// }, (args) => {
        const file = join(args.resolveDir, args.path);
        if (!shared.has(file)) return undefined;
        const path = relative(dirname(bundle), file).split(sep).join("/");
        return { path: path.startsWith(".") ? path : `./${path}`, external: true };
      });
    },
  };
}

/**
 * Each bundled module keeps its own location, relative to the bundle's URL (a bundle has one URL
 * for all its modules): code finds the files beside it that way (the Gym's entries, the `--import`
 * preloads, a package's own data). Our modules' `import.meta.url` is rewritten (tsc's output, which
 * uses it only as an expression); a CommonJS package gets its own `__filename` and `__dirname` as
 * variables of its module scope, so nothing in the package's text is rewritten. Through the banner's
 * `__bundleUrl`: `import.meta` itself would make esbuild take a CommonJS file for an ES module.
 */
function ownLocation(bundle) {
  return {
    name: "own-location",
    setup(b) {
      b.onLoad({ filter: /\.[cm]?js$/ }, async (args) => {
        const text = await readFile(args.path, "utf8");
        const ours = !args.path.split(sep).includes("node_modules");
        const url = `new URL(${JSON.stringify(relative(dirname(bundle), args.path).split(sep).join("/"))}, __bundleUrl)`;
        if (ours && text.includes("import.meta.url")) {
          return { contents: text.replace(/\bimport\.meta\.url\b/g, `${url}.href`), loader: "js", resolveDir: dirname(args.path) };
        }
        if (!ours && /\b__(?:filename|dirname)\b/.test(text)) {
          // On the first line: the package's own source map stays right past it.
          const own = `var __filename = __bundlePath(${url}), __dirname = __bundleDirname(__filename);`;
          return { contents: `${own}${text}`, loader: "js", resolveDir: dirname(args.path) };
        }
        return undefined;
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

const cliShared = await staticGraph(CLI_ENTRY, CLI_PROGRAM);
for (const target of await targets()) {
  await build({
    entryPoints: [target],
    // Chunks in the entry's own directory: the paths the plugins write are relative to it.
    outdir: dirname(target),
    entryNames: "[name]",
    chunkNames: `${basename(target, ".js")}-[name]-[hash]`,
    splitting: true,
    allowOverwrite: true,
    bundle: true,
    platform: "node",
    target: "node20",
    format: "esm",
    banner: { js: BANNER },
    plugins: [...(target === CLI_PROGRAM ? [leaveOut(cliShared, target)] : []), ownLocation(target)],
    sourcemap: "linked",
    sourcesContent: false,
    // Classes renamed to avoid collisions (CheckpointError → _CheckpointError) keep their own name:
    // a logged error's `type` is what an operator greps for.
    keepNames: true,
    logLevel: "warning",
  });
}
