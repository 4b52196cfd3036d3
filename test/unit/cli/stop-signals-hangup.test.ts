import { afterEach, describe, expect, it, vi } from "vitest";
import { listenForStop } from "../../../coordinator/cli/stop-signals.js";

/**
 * A terminal closing often delivers SIGHUP twice (the kernel's to the foreground group, then the
 * shell's to its jobs). The coordinator takes a second SIGTERM or SIGINT as "exit now"; a second
 * SIGHUP taken so would end it mid-stop (an op waiting out stop_grace_ms), its lease key left held
 * for a whole lease and no `coordinator_stopped` line. A repeated hangup is ignored instead.
 */
const SIGNALS = ["SIGTERM", "SIGINT", "SIGHUP"] as const;
let before: Map<string, unknown[]>;

function remember(): void {
  before = new Map(SIGNALS.map((s) => [s, process.listeners(s)]));
}

afterEach(() => {
  for (const s of SIGNALS) for (const l of process.listeners(s)) if (!before.get(s)!.includes(l)) process.off(s, l as () => void);
  vi.restoreAllMocks();
});

describe("the coordinator's stop signals", () => {
  it("stop it on SIGHUP, and a repeated SIGHUP does not exit mid-stop", async () => {
    remember();
    const exit = vi.spyOn(process, "exit").mockImplementation((() => undefined) as never);
    const stop = listenForStop(() => "running", 1_000);
    process.emit("SIGHUP", "SIGHUP");
    process.emit("SIGHUP", "SIGHUP");
    expect(await stop).toBe("SIGHUP");
    expect(exit).not.toHaveBeenCalled();
  });

  it("still exit at once on a SIGTERM after the stop began", async () => {
    remember();
    const exit = vi.spyOn(process, "exit").mockImplementation((() => undefined) as never);
    const stop = listenForStop(() => "running", 1_000);
    process.emit("SIGHUP", "SIGHUP");
    expect(await stop).toBe("SIGHUP");
    process.emit("SIGTERM", "SIGTERM");
    expect(exit).toHaveBeenCalledTimes(1);
  });
});
