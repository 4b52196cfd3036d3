import { describe, expect, it } from "vitest";
import { readableLogLine } from "../../../coordinator/local/readable-log-line.js";

describe("readableLogLine (the demo's rendering of its children's pino lines)", () => {
  it("renders level, message and the fields that say something; drops time, pid, name and trace ids", () => {
    const line = JSON.stringify({
      level: 40,
      time: 1796512992495,
      pid: 28212,
      name: "gym-ckpt",
      trace_id: "abc",
      file: "/tmp/w/collector.pid",
      reason: "pid 28006 is not running",
      attempts: 2,
      msg: "took over the lock file of a collector that no longer runs",
    });
    expect(readableLogLine(line)).toBe("warn: took over the lock file of a collector that no longer runs (file=/tmp/w/collector.pid, reason=pid 28006 is not running, attempts=2)");
    expect(readableLogLine(JSON.stringify({ level: 50, msg: "bad", err: { code: "unreachable" } }))).toBe('error: bad (err={"code":"unreachable"})');
    expect(readableLogLine(JSON.stringify({ level: 30, time: 1, msg: "started" }))).toBe("info: started");
  });

  it("returns anything else as it came: plain text, broken JSON, JSON that is not a pino line", () => {
    for (const line of ["[####----] 8/60 done", "{not json", '{"level":"warn","msg":"x"}', '{"level":40}', "[1,2]", "{}"]) {
      expect(readableLogLine(line)).toBe(line);
    }
  });
});
