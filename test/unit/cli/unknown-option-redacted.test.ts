import { afterEach, describe, expect, it, vi } from "vitest";
import { buildProgram } from "../../../coordinator/cli/program.js";

/**
 * A mistyped flag written with its value (`--controller_token=$T`, the config key's spelling) is an
 * unknown option: the refusal names the flag, never the value, which is usually the secret the flag
 * was meant to carry (stderr goes to terminals, CI logs, journald).
 */
let stderr = "";
afterEach(() => {
  vi.restoreAllMocks();
  stderr = "";
});

async function refused(...args: string[]): Promise<void> {
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  vi.spyOn(process.stdout, "write").mockImplementation(() => true);
  await expect((await buildProgram()).parseAsync(args, { from: "user" })).rejects.toMatchObject({ code: "commander.unknownOption" });
}

describe("gym-ckpt: an unknown option's value is not echoed", () => {
  it.each([
    ["coordinator", "--controller_token=SECRET-abc123"],
    ["status", "--tokn=SECRET-abc123"],
    ["ls", "--token_=SECRET'abc123\nSECRET-abc123"],
  ])("%s %s: invalid_request naming the flag", async (command, arg) => {
    await refused(command, arg);
    const flag = arg.slice(0, arg.indexOf("="));
    expect(stderr).toContain(`error invalid_request: unknown option '${flag}=[Redacted]'`);
    expect(stderr).not.toContain("SECRET");
    expect(stderr).not.toContain("abc123");
  });
});
