import { EventEmitter } from "node:events";
import { describe, expect, it, vi } from "vitest";

/**
 * A spawn that fails for want of file descriptors: node emits EMFILE and leaves the child without
 * a pid (its handle keeps pid 0). Killing that child would be kill(0): SIGKILL to the verifier's
 * whole process group, the program that started it included. A unit test: a real EMFILE is
 * timing-dependent, and a real kill(0) would end the test runner.
 */
const kill = vi.fn();
vi.mock("node:child_process", async (original) => ({
  ...(await original<typeof import("node:child_process")>()),
  spawn: () => {
    const child = Object.assign(new EventEmitter(), { pid: undefined, stdin: null, stdout: null, stderr: null, kill });
    process.nextTick(() => child.emit("error", Object.assign(new Error("spawn /bin/sh EMFILE"), { code: "EMFILE" })));
    return child;
  },
}));

describe("a sandbox child that could not be spawned", () => {
  it("answers crashed and is never killed (it has no pid)", async () => {
    const { runSandboxed } = await import("../../../participants/verifiers/sandbox/run-sandboxed.js");
    const outcome = await runSandboxed(
      { mode: "function", code: "function f() { return 1; }", function_name: "f", cases: [{ args: [] }] },
      { memoryMb: 48, caseTimeoutMs: 1000, startupMs: 1000, maxCaseOutputChars: 1024 },
    );
    expect(outcome).toMatchObject({ status: "crashed" });
    expect(kill).not.toHaveBeenCalled();
  });
});
