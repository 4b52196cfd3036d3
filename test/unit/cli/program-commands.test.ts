import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { COMMANDS, buildProgram } from "../../../coordinator/cli/program.js";

/** The CLI loads the command it runs by its name (COMMANDS): none may be left out or misnamed. */
describe("the gym-ckpt program's commands", () => {
  const dir = fileURLToPath(new URL("../../../coordinator/cli/commands/", import.meta.url));
  const files = readdirSync(dir).filter((f) => f.endsWith(".ts") && !f.startsWith("_"));
  const names = files.map((f) => f.replace(/\.ts$/, ""));

  it("lists every file under commands/, once, in file order (as help lists them)", () => {
    expect(files.length).toBeGreaterThan(10);
    expect(Object.keys(COMMANDS)).toEqual(names);
  });

  it("loads, under each name, the file that registers that command and no other", async () => {
    for (const name of names) {
      const mod: unknown = await import(/* @vite-ignore */ `../../../coordinator/cli/commands/${name}.js`);
      expect(await COMMANDS[name as keyof typeof COMMANDS](), `COMMANDS.${name}`).toBe(mod);
      expect((await buildProgram(name)).commands.map((c) => c.name()), `COMMANDS.${name}`).toEqual([name]);
    }
  });

  it("registers every command for anything but a command's name (help, an option, a mistyped name)", async () => {
    for (const first of [undefined, "--help", "help", "-V", "statsu", "constructor", "toString"]) {
      expect((await buildProgram(first)).commands.map((c) => c.name()), String(first)).toEqual(names);
    }
  });
});
