import { Command } from "commander";
import { afterEach, describe, expect, it, vi } from "vitest";
import { register } from "../../../coordinator/cli/commands/attach.js";

/**
 * docs/api.md §4: "`gym-ckpt <command> --help` lists every flag". `gym-ckpt attach --help` (or
 * `-h`) took `--help` for the kind and answered `error invalid_request: only \`attach model\`
 * exists (got "--help")`, exit 2; it now prints the command's usage, naming `attach model --help`
 * for the proxy's own flags, and exits 0.
 */
describe("gym-ckpt attach --help", () => {
  afterEach(() => {
    vi.restoreAllMocks();
    process.exitCode = undefined;
  });

  it.each(["--help", "-h"])("%s prints the usage and exits 0", async (flag) => {
    const out: string[] = [];
    const err: string[] = [];
    vi.spyOn(process.stdout, "write").mockImplementation((chunk) => (out.push(String(chunk)), true));
    vi.spyOn(process.stderr, "write").mockImplementation((chunk) => (err.push(String(chunk)), true));
    const program = new Command("gym-ckpt").exitOverride();
    register(program);
    await program.parseAsync(["attach", flag], { from: "user" });
    expect({ exitCode: process.exitCode ?? 0, stderr: err.join("") }).toEqual({ exitCode: 0, stderr: "" });
    expect(out.join("")).toMatch(/Usage: gym-ckpt attach/);
    expect(out.join("")).toMatch(/attach model --help/);
  });
});
