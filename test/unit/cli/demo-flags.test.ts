import { Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";

/** `gym-ckpt demo`: a flag it cannot honour is refused (exit 2, one line) before anything starts. */
const runDemo = vi.fn(async () => ({ ok: true, finished: 0, rows: 0, repeatedDeliveredCalls: 0 }));
vi.mock("../../../coordinator/local/demo.js", () => ({ runDemo }));
const { register } = await import("../../../coordinator/cli/commands/demo.js");

let stderr: string;
beforeEach(() => {
  stderr = "";
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  vi.spyOn(process.stdout, "write").mockImplementation(() => true);
  runDemo.mockClear();
  process.exitCode = undefined;
});
afterEach(() => {
  vi.restoreAllMocks();
  process.exitCode = undefined;
});

async function demo(...args: string[]): Promise<void> {
  const program = new Command().exitOverride();
  register(program);
  await program.parseAsync(["node", "gym-ckpt", "demo", ...args]);
}

describe("gym-ckpt demo flags", () => {
  it.each([
    ["--rows", "1.5"], // a row count the collection could never match: a sure "demo FAILED"
    ["--rows", "0x10"],
    ["--concurrency", "2.5"], // collect refuses it, after nats-server, coordinator and Gym started
    ["--checkpoint-every", "Infinity"],
    ["--token-delay-ms", "70000"], // the policy backend refuses more than 60000
    ["--crash-after", "0x0.8"],
  ])("%s %s: exit 2, one line naming the flag, nothing started", async (flag, value) => {
    await demo(flag, value);
    expect(runDemo).not.toHaveBeenCalled();
    expect(process.exitCode).toBe(2);
    expect(stderr).toMatch(new RegExp(`^error invalid_request: [^\\n]*${flag}[^\\n]*\\n$`));
  });

  it("a crash point that leaves no row unfinished is refused: nothing would be left to continue", async () => {
    await demo("--rows", "2", "--crash-after", "0.9");
    expect(runDemo).not.toHaveBeenCalled();
    expect(process.exitCode).toBe(2);
    expect(stderr).toMatch(/^error invalid_request: [^\n]*--crash-after[^\n]*\n$/);
  });

  it("the defaults go through", async () => {
    await demo();
    expect(runDemo).toHaveBeenCalledWith(expect.objectContaining({ rows: 60, concurrency: 8, checkpointEvery: 2, crashAfter: 0.4, tokenDelayMs: 60 }));
    expect(process.exitCode).toBe(0);
  });
});
