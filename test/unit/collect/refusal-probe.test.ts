import { describe, expect, it } from "vitest";
import { RefusalProbe, type Sleep } from "../../../coordinator/collect/refusal-probe.js";

/** A fake clock's sleep: records each wait asked for; the test ends it (or an abort does). */
function fakeSleep() {
  const waits: { seconds: number; end: () => void }[] = [];
  const sleep: Sleep = (seconds, until) =>
    new Promise<void>((resolve) => {
      waits.push({ seconds, end: resolve });
      until.addEventListener("abort", () => resolve(), { once: true });
    });
  return { sleep, waits };
}

/** Whether `promise` has settled once pending callbacks ran. */
async function settled(promise: Promise<unknown>): Promise<boolean> {
  let done = false;
  void promise.then(() => (done = true));
  for (let i = 0; i < 5; i++) await Promise.resolve();
  return done;
}

describe("RefusalProbe", () => {
  it("one row probes, its wait doubling up to the cap (equal jitter: between half and all of it); the others send nothing until it is admitted", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(0.25, 4, clock.sleep, () => 1);
    // 10,000 rows refused at once: one wait, for one row.
    const others = Array.from({ length: 10_000 }, (_, i) => `row-${i}`);
    const first = probe.refused("probe", probe.sending());
    const waiting = others.map((row) => probe.refused(row, probe.sending()));
    expect(clock.waits.map((w) => w.seconds)).toEqual([0.25]);
    expect(probe.waitingRows).toBe(10_000);
    const grown: number[] = [];
    let sent = first;
    for (let i = 0; i < 6; i++) {
      clock.waits.at(-1)!.end();
      await sent; // the probe is sent again, and refused again
      sent = probe.refused("probe", probe.sending());
      grown.push(clock.waits.at(-1)!.seconds);
    }
    expect(grown).toEqual([0.5, 1, 2, 4, 4, 4]);
    expect(await settled(Promise.race(waiting))).toBe(false);
    probe.answered(probe.sending());
    await Promise.all(waiting);
    // The next refusal starts over.
    void probe.refused("row-1", probe.sending());
    expect(clock.waits.at(-1)!.seconds).toBe(0.25);
  });

  it("jitter draws between half and all of the grown wait", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(0.25, 4, clock.sleep, () => 0);
    void probe.refused("a", probe.sending());
    expect(clock.waits[0]!.seconds).toBe(0.125);
  });

  it("a probe that leaves (its row failed or finished) hands over to one waiting row, sent at once, its backoff going on", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(0.25, 4, clock.sleep, () => 1);
    void probe.refused("a", probe.sending());
    const b = probe.refused("b", probe.sending());
    const c = probe.refused("c", probe.sending());
    probe.left("b"); // not the probe: nothing changes
    expect(await settled(b)).toBe(false);
    probe.left("a");
    expect(await settled(b)).toBe(true);
    expect(await settled(c)).toBe(false);
    void probe.refused("b", probe.sending()); // b is the probe now: its wait is the next one, not the first
    expect(clock.waits.map((w) => w.seconds)).toEqual([0.25, 0.5]);
    expect(probe.waitingRows).toBe(1);
  });

  it("wakeAll (the collection stops) ends every wait, the probe's included", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(0.25, 4, clock.sleep, () => 1);
    const a = probe.refused("a", probe.sending());
    const b = probe.refused("b", probe.sending());
    probe.wakeAll();
    expect(await settled(Promise.all([a, b]))).toBe(true);
  });

  it("a reply to a /run sent before the last one refused wakes nobody: admission may have closed since", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(0.25, 4, clock.sleep, () => 1);
    const early = probe.sending(); // a long /run, admitted before the other checkpoint closed admission
    void probe.refused("a", probe.sending());
    const b = probe.refused("b", probe.sending());
    probe.answered(early); // it finishes while admission is closed
    expect(await settled(b)).toBe(false);
    probe.answered(probe.sending()); // the probe, sent again, is admitted
    expect(await settled(b)).toBe(true);
  });

  it("a waiting row given a bound stops waiting at it (false: it was not sent again) and leaves the waiting rows; one woken before it goes again (true)", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(1, 4, clock.sleep, () => 1);
    void probe.refused("a", probe.sending(), 30);
    const b = probe.refused("b", probe.sending(), 2);
    const c = probe.refused("c", probe.sending(), 3);
    expect(clock.waits.map((w) => w.seconds)).toEqual([1, 2, 3]);
    clock.waits[1]!.end(); // b's bound passes, nothing answered
    expect(await b).toBe(false);
    expect(probe.waitingRows).toBe(1);
    probe.answered(probe.sending());
    expect(await c).toBe(true);
  });

  it("the probe's wait is cut to its bound: it is sent once more then, not a whole backoff later", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(1, 4, clock.sleep, () => 1);
    void probe.refused("a", probe.sending(), 0.5);
    expect(clock.waits.map((w) => w.seconds)).toEqual([0.5]);
  });

  it("answered says whether the /run was sent after the last one refused (the shared cause is gone)", () => {
    const probe = new RefusalProbe<string>(1, 4, fakeSleep().sleep, () => 1);
    const early = probe.sending();
    void probe.refused("a", probe.sending());
    expect(probe.answered(early)).toBe(false);
    expect(probe.answered(probe.sending())).toBe(true);
  });

  it("answered with a bound (a descriptor shortage here) wakes at most that many waiting rows, in the order they waited; the cause is over only once none is left waiting", async () => {
    const clock = fakeSleep();
    const probe = new RefusalProbe<string>(1, 4, clock.sleep, () => 1);
    void probe.refused("p", probe.sending());
    const woken: string[] = [];
    const rows = ["a", "b", "c", "d", "e"];
    const waits = rows.map((row) => probe.refused(row, probe.sending()).then(() => woken.push(row)));
    expect(probe.answered(probe.sending(), 2)).toBe(false);
    await settled(Promise.all(waits));
    expect(woken).toEqual(["a", "b"]);
    expect(probe.waitingRows).toBe(3);
    // One woken refused again (still no descriptor): it waits again, and an answer to a /run sent before it wakes nobody.
    const early = probe.sending();
    const bAgain = probe.refused("b", probe.sending()).then(() => woken.push("b"));
    expect(probe.answered(early, 2)).toBe(false);
    await settled(bAgain);
    expect(woken).toEqual(["a", "b"]);
    // A later connection: the next two; then the last, which ends the cause.
    expect(probe.answered(probe.sending(), 2)).toBe(false);
    await settled(Promise.all(waits));
    expect(woken).toEqual(["a", "b", "c", "d"]);
    expect(probe.answered(probe.sending(), 2)).toBe(true);
    await Promise.all([...waits, bAgain]);
    expect(woken).toEqual(["a", "b", "c", "d", "e", "b"]);
    expect(probe.probing).toBe(false);
  });
});
