import { readFileSync, readdirSync } from "node:fs";
import { join, sep } from "node:path";
import { describe, expect, it } from "vitest";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * The bundled process entries (deploy/bundle-entries.mjs) keep their classes' names. esbuild
 * renames a class whose name another module reuses (`var CheckpointError = class _CheckpointError`),
 * and a logged error's `type` is its constructor's name: an operator grepping the logs for
 * `CheckpointError` found `_CheckpointError`. With keepNames each renamed class sets its own name
 * back (`static { __name(this, "CheckpointError") }`).
 */
describe("the bundled entries", () => {
  it("name CheckpointError (a logged refusal's err.type) CheckpointError in every bundle and chunk", () => {
    ensureBuilt();
    // Each entry and the chunks beside it (`main-*.js`, `program-*.js`: what it imports dynamically, and their shared code).
    const bundles = ["coordinator", "participants"].flatMap((top) =>
      readdirSync(join("dist", top), { recursive: true, encoding: "utf8" })
        .filter((path) => /(?:^|\/)main(?:-[\w-]+)?\.js$/.test(path.split(sep).join("/")) || /(?:^|\/)cli\/program-[\w-]+\.js$/.test(path.split(sep).join("/")))
        .map((path) => join("dist", top, path)),
    );
    const declared = bundles.filter((file) => /\bclass (_?)CheckpointError extends Error\b/.test(readFileSync(file, "utf8")));
    expect(declared.length).toBeGreaterThan(0); // the entries are bundles, and the check sees them
    const misnamed = declared.filter((file) => {
      const text = readFileSync(file, "utf8");
      return /class _CheckpointError extends Error/.test(text) && !/class _CheckpointError extends Error \{\s*static \{\s*__name\(this, "CheckpointError"\)/.test(text);
    });
    expect(misnamed).toEqual([]);
  });
});
