import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * Holds a node program at its first `require` (Module._load, preloaded with NODE_OPTIONS=--require):
 * in a bundled entry (deploy/bundle-entries.mjs) that is the first npm package's initialisation, once
 * the entry module's own code has run. So a test can act on a process that has installed its early
 * signal listeners but not yet loaded its dependencies. The hold blocks the main thread, as a slow
 * load would: a signal sent meanwhile is handled once it ends.
 */
export interface PausedPackageLoad {
  /** The environment that installs the hook in a node process started with it. */
  env: NodeJS.ProcessEnv;
  /** Whether the process is held at its first require now (the request's name once it is). */
  reached(): boolean;
  /** Lets it load on. */
  release(): Promise<void>;
  remove(): Promise<void>;
}

export async function pausedPackageLoad(): Promise<PausedPackageLoad> {
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-paused-load-"));
  const reached = join(dir, "reached");
  const go = join(dir, "go");
  const preload = join(dir, "preload.cjs");
  await writeFile(
    preload,
    [
      `const Module = require("node:module");`,
      `const { existsSync, writeFileSync } = require("node:fs");`,
      `const load = Module._load;`,
      `let paused = false;`,
      `Module._load = function (request, ...rest) {`,
      `  if (!paused) {`,
      `    paused = true;`,
      `    writeFileSync(${JSON.stringify(reached)}, String(request));`,
      // Bounded: a test that never releases must not leave the process held for ever.
      `    const until = Date.now() + 60_000;`,
      `    const cell = new Int32Array(new SharedArrayBuffer(4));`,
      `    while (!existsSync(${JSON.stringify(go)}) && Date.now() < until) Atomics.wait(cell, 0, 0, 5);`,
      `  }`,
      `  return load.call(this, request, ...rest);`,
      `};`,
    ].join("\n"),
  );
  return {
    env: { NODE_OPTIONS: `--require ${preload}` },
    reached: () => existsSync(reached),
    release: () => writeFile(go, ""),
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}
