import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ProgressReporter, progressClock, type ProgressSnapshot } from "../../../coordinator/collect/progress-reporter.js";

/** The progress line against an injected clock; its timer runs on fake timers moved in step. */
let clock: number;
beforeEach(() => {
  clock = 1_000_000;
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
});
afterEach(() => {
  vi.useRealTimers();
});

/** Moves the clock and the timers together, 100 ms at a time. */
function advance(ms: number): void {
  for (let moved = 0; moved < ms; moved += 100) {
    clock += 100;
    vi.advanceTimersByTime(100);
  }
}

function sink(isTTY: boolean) {
  const written: string[] = [];
  return { written, out: { write: (s: string) => written.push(s), isTTY } as unknown as NodeJS.WritableStream };
}

const snapshot = (over: Partial<ProgressSnapshot> = {}): ProgressSnapshot => ({
  total: 1000,
  done: 900,
  doneBefore: 900,
  inFlight: 1,
  failed: 0,
  checkpoints: 0,
  lastCheckpointAt: undefined,
  ...over,
});

describe("progress reporter", () => {
  it("cuts the live line to the terminal's width, read at each redraw, so a narrow terminal does not wrap it on every redraw", () => {
    const written: string[] = [];
    const out = { write: (s: string) => written.push(s), isTTY: true, columns: 40 } as unknown as NodeJS.WritableStream & { columns: number };
    const reporter = new ProgressReporter(out, 2000, () => clock);
    reporter.update(snapshot());
    out.columns = 30; // resized
    reporter.update(snapshot());
    expect(written).toEqual([`\r${reporter.format(snapshot()).slice(0, 39)}`, `\r${reporter.format(snapshot()).slice(0, 29)}`]);
    reporter.finish();
  });

  it("rates only the rows this run finished: 900 of 1000 done before, 1 row/s now", () => {
    const { out } = sink(false);
    const reporter = new ProgressReporter(out, 2000, () => clock);
    reporter.start(() => snapshot());
    advance(5000);
    const line = reporter.format(snapshot({ done: 905 }));
    expect(line).toContain("905/1000 done");
    expect(line).toContain("| 1.0 rows/s, ETA 1m35s |");
    reporter.finish();
  });

  it("names the rows whose retire keeps failing (Gym servers unreachable), and nothing while there are none", () => {
    const reporter = new ProgressReporter(sink(false).out, 2000, () => clock);
    expect(reporter.format(snapshot({ retiresFailing: 2 }))).toMatch(/\| retire failing for 2 rows$/);
    expect(reporter.format(snapshot({ retiresFailing: 0 }))).not.toContain("retire failing");
  });

  it("counts the rate from start(), not from when the reporter was made (start-up may take long)", () => {
    const { out } = sink(false);
    const reporter = new ProgressReporter(out, 2000, () => clock);
    advance(60_000); // restoring a checkpoint
    reporter.start(() => snapshot());
    advance(10_000);
    expect(reporter.format(snapshot({ done: 910 }))).toContain("| 1.0 rows/s, ETA 1m30s |");
    reporter.finish();
  });

  it("writes a plain line every interval while no row finishes, one interval after the last line, until finish", () => {
    const { out, written } = sink(false);
    const reporter = new ProgressReporter(out, 2000, () => clock);
    let lastCheckpointAt: number | undefined;
    reporter.start(() => snapshot({ lastCheckpointAt, checkpoints: lastCheckpointAt === undefined ? 0 : 1 }));
    advance(6500);
    expect(written).toHaveLength(3);
    expect(written.every((l) => l.endsWith("\n") && l.includes("900/1000 done, 1 in flight"))).toBe(true);
    // A checkpoint ends at 6.5 s (forced line): the next timed one comes 2 s after it, not at 8 s.
    lastCheckpointAt = clock;
    reporter.update(snapshot({ lastCheckpointAt, checkpoints: 1 }), true);
    advance(1900);
    expect(written).toHaveLength(4);
    advance(100);
    expect(written).toHaveLength(5);
    expect(written[4]).toContain("checkpoints 1, last 2s ago");
    reporter.finish();
    advance(10_000);
    expect(written).toHaveLength(5);
  });

  it("redraws the live bar every second on a terminal while nothing changes", () => {
    const { out, written } = sink(true);
    const reporter = new ProgressReporter(out, 10_000, () => clock);
    reporter.start(() => snapshot());
    advance(3000);
    expect(written).toHaveLength(3);
    expect(written.every((l) => l.startsWith("\r["))).toBe(true);
    reporter.finish();
    expect(written.at(-1)).toBe("\n");
    advance(3000);
    expect(written).toHaveLength(4);
  });

  it("finish ends the live line once, and nothing draws it again after (a late update on the way out would leave it unended)", () => {
    const { out, written } = sink(true);
    const reporter = new ProgressReporter(out, 10_000, () => clock);
    reporter.start(() => snapshot());
    reporter.update(snapshot({ done: 901 }));
    reporter.finish();
    reporter.update(snapshot({ done: 902 }), true); // a worker's report after the exit began
    reporter.finish(); // every exit path ends it: a second finish writes nothing
    advance(3000);
    expect(written).toEqual([expect.stringMatching(/^\r\[.*901\/1000 done/), "\n"]);
  });
});

describe("progress reporter on its default clock", () => {
  it("a wall-clock step moves neither the rate nor the last checkpoint's age (monotonic clock)", () => {
    vi.useFakeTimers({ toFake: ["Date", "setTimeout", "clearTimeout"] }); // Date alone steps; performance.now() is real
    const { written, out } = sink(false);
    const reporter = new ProgressReporter(out, 10_000);
    reporter.update(snapshot({ done: 950, checkpoints: 1, lastCheckpointAt: progressClock() }), true);
    vi.setSystemTime(Date.now() + 3_600_000); // NTP steps the wall clock an hour forward
    reporter.update(snapshot({ done: 950, checkpoints: 1, lastCheckpointAt: progressClock() - 5_000 }), true);
    expect(written.at(-1)).toContain("last 5s ago");
    expect(written.at(-1)).not.toMatch(/ETA [1-9]\d*h/); // 50 rows in well under a second: no hour-long ETA
  });
});

describe("progress of the tasks file's read", () => {
  it("draws on the live line, which the bar then draws over, and readDone ends it only when one was drawn", () => {
    const { written, out } = sink(true);
    const reporter = new ProgressReporter(out, 10_000, () => clock);
    reporter.readDone();
    expect(written).toEqual([]);
    reporter.reading("tasks.jsonl", 120_000, 3 * 2 ** 20 + 5);
    expect(written).toEqual(["\rreading --tasks tasks.jsonl: 120000 rows, 3 MiB so far"]);
    reporter.readDone();
    expect(written.at(-1)).toBe("\n");
    reporter.update(snapshot());
    expect(written.at(-1)).toMatch(/^\r\[/);
  });

  it("writes a plain line at most once per interval when stderr is no terminal", () => {
    const { written, out } = sink(false);
    const reporter = new ProgressReporter(out, 10_000, () => clock);
    reporter.reading("t.jsonl", 1, 0);
    reporter.reading("t.jsonl", 2, 0);
    advance(10_000);
    reporter.reading("t.jsonl", 3, 0);
    reporter.readDone();
    expect(written).toEqual(["reading --tasks t.jsonl: 1 rows, 0 MiB so far\n", "reading --tasks t.jsonl: 3 rows, 0 MiB so far\n"]);
  });
});
