import { describe, expect, it } from "vitest";
import { collectHarness } from "./collect-processes.js";

/**
 * `gym-ckpt collect` SIGKILLed at an exact controller op (a relay holds the op or drops its reply),
 * then started again: the next start finishes every row once, with nothing lost or repeated.
 */
const { setUp, startCollector, finishCleanly, stopAndRequeue, killAt } = collectHarness();

describe("collect restarted after a SIGKILL at a chosen controller op", () => {
  it("between a checkpoint's publish and its resume, Gym servers alive and parked: the next start resumes them and finishes every row", { timeout: 60_000 }, async () => {
    const w = await setUp(3);
    await w.backend.hold(1);
    await killAt(w, "resume", "hold", "SIGUSR1");
    await w.backend.release();
    await finishCleanly(w, 3);
  });

  it("while the restore of a requeued run's stop checkpoint is held: the next start still continues the rows from that checkpoint", { timeout: 60_000 }, async () => {
    const w = await setUp(3);
    await stopAndRequeue(w, 3);
    await killAt(w, "restore", "hold");
    const out = await finishCleanly(w, 3);
    expect(out).toContain("rows continued from a checkpoint: 3, restarted from input: 0");
  });

  it("after the restore landed (reply lost) and the Gym restarted again: the next start finishes (not restore_failed)", { timeout: 60_000 }, async () => {
    const w = await setUp(3);
    await stopAndRequeue(w, 3);
    await killAt(w, "restore", "drop-reply");
    await w.crashAndRestart();
    await finishCleanly(w, 3);
  });

  it("…and the attempt + 1 the coordinator's clean-up fenced costs no attempt (--max-attempts 1 finishes every row)", { timeout: 60_000 }, async () => {
    const w = await setUp(3);
    await stopAndRequeue(w, 3);
    await killAt(w, "restore", "drop-reply");
    await w.crashAndRestart();
    const out: string[] = [];
    const collector = await startCollector(w, ["--max-attempts", "1"], out);
    expect(await collector.exited, out.join("\n")).toEqual({ code: 0, signal: null });
    expect(out).toContain("rows: 3 (finished 3, failed 0), mean reward 1.000");
  });
});
