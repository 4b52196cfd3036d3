import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

/**
 * Holds a node program while it loads its first npm package (the first module resolved under
 * node_modules), through a module resolve hook preloaded with NODE_OPTIONS=--import: so a test can
 * act on a process that has run its entry module's own code but not yet loaded its dependencies.
 */
export interface PausedPackageLoad {
  /** The environment that installs the hook in a node process started with it. */
  env: NodeJS.ProcessEnv;
  /** Whether the process is held at its first package now (the resolved URL once it is). */
  reached(): boolean;
  /** Lets it load on. */
  release(): Promise<void>;
  remove(): Promise<void>;
}

export async function pausedPackageLoad(): Promise<PausedPackageLoad> {
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-paused-load-"));
  const reached = join(dir, "reached");
  const go = join(dir, "go");
  const hooks = join(dir, "hooks.mjs");
  const preload = join(dir, "preload.mjs");
  await writeFile(
    hooks,
    [
      `import { existsSync, writeFileSync } from "node:fs";`,
      `let paused = false;`,
      `export async function resolve(specifier, context, next) {`,
      `  const resolved = await next(specifier, context);`,
      `  if (!paused && resolved.url.includes("/node_modules/")) {`,
      `    paused = true;`,
      `    writeFileSync(${JSON.stringify(reached)}, resolved.url);`,
      // Bounded: a test that never releases must not leave the process held for ever.
      `    const until = Date.now() + 60_000;`,
      `    while (!existsSync(${JSON.stringify(go)}) && Date.now() < until) await new Promise((r) => setTimeout(r, 5));`,
      `  }`,
      `  return resolved;`,
      `}`,
    ].join("\n"),
  );
  await writeFile(preload, `import { register } from "node:module";\nregister(${JSON.stringify(pathToFileURL(hooks).href)});\n`);
  return {
    env: { NODE_OPTIONS: `--import ${pathToFileURL(preload).href}` },
    reached: () => existsSync(reached),
    release: () => writeFile(go, ""),
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}
