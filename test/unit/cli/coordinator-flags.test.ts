import { writeFile } from "node:fs/promises";
import { Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { register } from "../../../coordinator/cli/commands/coordinator.js";
import { integerFlag, runCli } from "../../../coordinator/cli/shared.js";
import { CheckpointError } from "../../../protocol/index.js";

/** `gym-ckpt coordinator --print-config` in process: numeric flags are decimal integers, checked before the daemon starts. */
let stdout: string;
let stderr: string;
beforeEach(() => {
  stdout = "";
  stderr = "";
  vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => ((stdout += String(chunk)), true));
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  process.exitCode = undefined;
});
afterEach(() => {
  vi.restoreAllMocks();
  process.exitCode = undefined;
});

async function printConfig(...args: string[]): Promise<number> {
  const program = new Command().exitOverride();
  register(program);
  await program.parseAsync(["coordinator", "--token", "t", "--checkpoint-root", "/ckpt", "--print-config", ...args], { from: "user" });
  return Number(process.exitCode ?? 0);
}

describe("gym-ckpt coordinator numeric flags", () => {
  it("takes decimal integers", async () => {
    expect(await printConfig("--retention", "3", "--lease-ms", "2500", "--default-timeout-ms", "1000", "--http-port", "0")).toBe(0);
    expect(JSON.parse(stdout)).toMatchObject({ retention: 3, lease_ms: 2500, default_timeout_ms: 1000, http: { port: 0 } });
  });

  it.each([
    ["--http-port", ""],
    ["--http-port", " "],
    ["--retention", "0x10"],
    ["--lease-ms", "1e3"],
    ["--default-timeout-ms", "2000.5"],
    ["--http-port", "soon"],
  ])("refuses %s %j with invalid_request (exit 2), printing no config", async (flag, value) => {
    expect(await printConfig(flag, value)).toBe(2);
    expect(stderr).toBe(`error invalid_request: ${flag} must be a decimal integer, got ${JSON.stringify(value)}\n`);
    expect(stdout).toBe("");
  });

  it("leaves the range to the config schema (exit 2 naming the key)", async () => {
    expect(await printConfig("--retention", "0")).toBe(2);
    expect(stderr).toMatch(/^error invalid_request: invalid configuration:[^]*retention/);
  });

  it("refuses a default_timeout_ms past the 7-day deadline cap participants enforce (exit 2), accepts 7 days", async () => {
    expect(await printConfig("--default-timeout-ms", String(7 * 24 * 3600 * 1000 + 1))).toBe(2);
    expect(stderr).toMatch(/^error invalid_request: invalid configuration:[^]*default_timeout_ms/);
    expect(stdout).toBe("");
    process.exitCode = undefined;
    expect(await printConfig("--default-timeout-ms", String(7 * 24 * 3600 * 1000))).toBe(0);
  });

  it("integerFlag, shared by every command's integer flags, is decimal-only too", () => {
    expect(integerFlag("leader-wait-ms", "250", 0)).toBe(250);
    for (const value of ["0x10", "1e3", "0b1", "", "+"]) expect(() => integerFlag("leader-wait-ms", value, 0)).toThrow(expect.objectContaining({ code: "invalid_request" }));
  });
});

describe("runCli exit codes", () => {
  const refuse = (code: "unauthorized" | "invalid_request" | "not_leader") => async () => {
    throw new CheckpointError(code, "refused");
  };
  it("exits 2 for invalid_request and for the codes a command counts as configuration, 1 for other refusals", async () => {
    const exit = async (run: Promise<void>) => (await run, Number(process.exitCode ?? 0));
    expect(await exit(runCli(refuse("unauthorized")))).toBe(1);
    expect(await exit(runCli(refuse("invalid_request")))).toBe(2);
    expect(await exit(runCli(refuse("unauthorized"), ["unauthorized"]))).toBe(2);
    expect(await exit(runCli(refuse("not_leader"), ["unauthorized"]))).toBe(1);
    expect(stderr).toBe("error unauthorized: refused\nerror invalid_request: refused\nerror unauthorized: refused\nerror not_leader: refused\n");
  });

  it("prints a file call the storage refused as storage_error (collect's --out on a full disk), anything else thrown as internal_error; exit 1", async () => {
    const exit = async (run: Promise<void>) => (await run, Number(process.exitCode ?? 0));
    // A real ENOSPC (writing to /dev/full fails so for root too), as an append to --out meets it.
    expect(await exit(runCli(() => writeFile("/dev/full", "row\n")))).toBe(1);
    expect(await exit(runCli(async () => Promise.reject(new Error("a bug"))))).toBe(1);
    expect(stderr).toBe("error storage_error: ENOSPC: no space left on device, write\nerror internal_error: a bug\n");
  });
});
