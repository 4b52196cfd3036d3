import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { startControllerRelay } from "../support/controller-relay.js";
import { collectHarness } from "./collect-processes.js";

/** How `gym-ckpt collect` ends when it cannot finish: Gym servers down, Ctrl-C, a closed terminal. */
const { setUp, startCollector } = collectHarness();

describe("collect exit paths", () => {
  it("an environment server that is down: the collection ends (rows failed, exit 1) instead of retrying the retire forever", { timeout: 60_000 }, async () => {
    const w = await setUp(2);
    await w.gym.kill(["model", "resources", "agent", "environment"], "SIGKILL");
    const out: string[] = [];
    const collector = await startCollector(w, ["--run-timeout-s", "3"], out);
    const outcome = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("still running after 40 s"), 40_000))]);
    expect(outcome, out.slice(-3).join("\n")).toEqual({ code: 1, signal: null });
    expect(out.some((l) => l.startsWith("rows: 2 (finished 0, failed 2)")), out.join("\n")).toBe(true);
    // The summary says why each row failed, not only how many.
    expect(out.filter((l) => l.startsWith("failed row ")), out.join("\n")).toHaveLength(2);
    expect(existsSync(join(w.root, "collector.pid"))).toBe(false);
  });

  it.each([
    { signal: "SIGINT" as const, exit: { code: 130, signal: null }, what: "Ctrl-C" },
    // Dies by the hangup itself once stopped: its parent sees SIGHUP (a shell reports 129).
    { signal: "SIGHUP" as const, exit: { code: null, signal: "SIGHUP" }, what: "a closed terminal" },
  ])("$what ($signal) removes collector.pid and exits as by $signal", { timeout: 60_000 }, async ({ signal, exit }) => {
    const w = await setUp(1);
    await w.backend.hold(0);
    const collector = await startCollector(w);
    await w.waitFor(async () => (await w.backend.calls()).length >= 1, "the row running");
    collector.child.kill(signal);
    expect(await collector.exited).toEqual(exit);
    expect(existsSync(join(w.root, "collector.pid"))).toBe(false);
    await w.backend.release();
  });

  it("a --checkpoint-dir that is not the coordinator's root: refused (exit 2) and the directories the start made for it are gone", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    await w.client.checkpoint({ checkpoint_id: "elsewhere-1", episode_ids: [] });
    const out: string[] = [];
    // The last --checkpoint-dir counts: two levels that do not exist yet.
    const collector = await startCollector(w, ["--checkpoint-dir", join(w.root, "other", "deeper")], out);
    expect(await collector.exited, out.join("\n")).toEqual({ code: 2, signal: null });
    expect(out.join("\n")).toContain("elsewhere-1");
    expect(existsSync(join(w.root, "other"))).toBe(false);
  });

  it("a second SIGTERM during the stop checkpoint is ignored, and a Ctrl-C then still removes collector.pid", { timeout: 60_000 }, async () => {
    const w = await setUp(2);
    await w.backend.hold(0);
    const relay = await startControllerRelay(w, (op) => (op === "commit" ? "hold" : "pass"));
    const collector = await startCollector(w, ["--deployment", relay.deployment]);
    await w.waitFor(async () => (await w.backend.calls()).length >= 2, "the rows running");
    const commitHeld = relay.when((op) => op === "commit");
    collector.child.kill("SIGTERM");
    await commitHeld;
    collector.child.kill("SIGTERM");
    // Still running its stop checkpoint: the second SIGTERM neither killed it nor cut it short.
    expect(await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("running"), 500))])).toBe("running");
    collector.child.kill("SIGINT");
    expect(await collector.exited).toEqual({ code: 130, signal: null });
    expect(existsSync(join(w.root, "collector.pid"))).toBe(false);
    await relay.close();
    await w.backend.release();
  });
});
