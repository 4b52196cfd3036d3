import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { COMMANDS, buildProgram } from "../../../coordinator/cli/program.js";

/** The CLI lists its commands statically (so the build can bundle them): none may be left out. */
describe("the gym-ckpt program's commands", () => {
  const dir = fileURLToPath(new URL("../../../coordinator/cli/commands/", import.meta.url));
  const files = readdirSync(dir).filter((f) => f.endsWith(".ts") && !f.startsWith("_"));

  it("lists every file under commands/, once", async () => {
    expect(files.length).toBeGreaterThan(10);
    for (const file of files) {
      const name = file.replace(/\.ts$/, "");
      const mod: unknown = await import(/* @vite-ignore */ `../../../coordinator/cli/commands/${name}.js`);
      expect(COMMANDS.filter((c) => c === mod), `${file} is missing from COMMANDS in program.ts`).toHaveLength(1);
    }
    expect(COMMANDS).toHaveLength(files.length);
  });

  it("registers one command per file, in file order (as help lists them)", () => {
    const names = buildProgram().commands.map((c) => c.name());
    expect(names).toEqual(files.map((f) => f.replace(/\.ts$/, "")));
  });
});
