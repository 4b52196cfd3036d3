import { spawn, type ChildProcess } from "node:child_process";
import { afterEach, describe, expect, it } from "vitest";
import { alive, killAll, TrackedProcesses } from "../../support/process-tree.js";
import { waitUntil } from "../../support/wait-until.js";

/** Test teardown kills only the processes a test started: a pid reused since by another process is left alone. */
describe("TrackedProcesses and killAll", () => {
  // killAll is what is under test: if it fails, the teardown still kills the child.
  let child: ChildProcess | undefined;
  afterEach(() => {
    if (child && child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    child = undefined;
  });

  it("kills a tracked process still running, and skips one that exited (its pid may name another process by now)", async () => {
    const running = (child = spawn("sleep", ["30"], { stdio: "ignore" }));
    const done = spawn("true", [], { stdio: "ignore" });
    const tracked = new TrackedProcesses().add(running.pid!).add(done.pid!);
    await new Promise((resolve) => done.once("exit", resolve));
    expect([tracked.isSame(running.pid!), tracked.isSame(done.pid!)]).toEqual([true, false]);
    // A pid never recorded with its start time (this process itself stands in for a reused one) is never killed.
    expect(tracked.isSame(process.pid)).toBe(false);
    killAll(tracked);
    await waitUntil(() => !alive(running.pid!), "the tracked process to die");
  });
});
