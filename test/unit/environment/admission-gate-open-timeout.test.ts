import { describe, expect, it } from "vitest";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { AdmissionGate } from "../../../participants/kinds/environment/admission-gate.js";

const flush = () => new Promise((resolve) => setImmediate(resolve));

/**
 * withOpenTimeout (an episode's clean-up call, `timed`) counts the time admission was open between
 * checkpoints: a duration. Counted on the wall clock, a step forward (NTP, a VM resume) ended the
 * call at the next checkpoint's close, and a step back gave it the step on top.
 */
describe("admission gate open timeout", () => {
  it("is a duration: a wall-clock step forward or back neither ends nor stretches it", async () => {
    const clock = new ManualClock();
    const gate = new AdmissionGate(clock);
    let signal!: AbortSignal;
    const call = gate.withOpenTimeout(
      1000,
      () => new Error("timed out"),
      (s) => {
        signal = s;
        return new Promise((_, reject) => s.addEventListener("abort", () => reject(s.reason)));
      },
    );
    const outcome = call.catch((error: unknown) => error);
    clock.advance(100);
    clock.stepWall(3_600_000); // the wall clock steps an hour forward
    gate.close(); // a checkpoint wakes the countdown
    await flush();
    expect(signal.aborted).toBe(false);
    gate.open();
    await flush();
    clock.advance(400);
    clock.stepWall(-7_200_000); // and two hours back
    gate.close();
    await flush();
    gate.open();
    await flush();
    clock.advance(499);
    await flush();
    expect(signal.aborted).toBe(false);
    clock.advance(1); // 1000 ms open in all
    await flush();
    expect(signal.aborted).toBe(true);
    expect(await outcome).toMatchObject({ message: "timed out" });
  });
});
