import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { buildProgram } from "../../../coordinator/cli/program.js";

/**
 * The README is the first thing a newcomer runs: its quick start is two commands (the demo, the
 * tests), each an npm script package.json defines, its development commands too, and its command
 * table names every `gym-ckpt` command, so a script renamed or a command added cannot leave it behind.
 */
const readme = readFileSync(new URL("../../../README.md", import.meta.url), "utf8");
const scripts = (JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as { scripts: Record<string, string> }).scripts;

/** The npm commands of the first ```sh block after `heading`. */
function npmCommands(heading: string): string[] {
  const from = readme.indexOf(heading);
  expect(from, heading).toBeGreaterThanOrEqual(0);
  const block = /```sh\n([\s\S]*?)```/.exec(readme.slice(from))![1]!;
  return block.split("\n").filter((line) => line.trim() !== "").map((line) => line.replace(/\s+#.*$/, "").trim());
}

/** The script `npm test` or `npm run <name> [-- args]` runs. */
const scriptOf = (command: string) => (command === "npm test" ? "test" : /^npm run ([\w:-]+)/.exec(command)?.[1]);

describe("README", () => {
  it("starts with two commands, the demo and the tests, both package.json scripts", () => {
    const quickStart = npmCommands("## Quick start");
    expect(quickStart).toEqual(["npm run demo", "npm test"]);
    for (const command of quickStart) expect(Object.keys(scripts), command).toContain(scriptOf(command));
  });

  it("names only package.json scripts under Development", () => {
    const development = npmCommands("## Development");
    expect(development.length).toBeGreaterThan(0);
    for (const command of development) expect(Object.keys(scripts), command).toContain(scriptOf(command));
  });

  it("lists every gym-ckpt command in its command table", async () => {
    const table = readme.slice(readme.indexOf("## The `gym-ckpt` command"), readme.indexOf("## Development"));
    const cells = [...table.matchAll(/^\| (`gym-ckpt .*?) \|/gm)].map((m) => m[1]!).join(" ");
    const listed = new Set([...cells.matchAll(/`(?:gym-ckpt )?([a-z]+)/g)].map((m) => m[1]!));
    for (const command of (await buildProgram()).commands) expect([...listed], command.name()).toContain(command.name());
  });
});
