import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { highestEpochInUse } from "../../../coordinator/daemon/epoch-floor.js";

function capture() {
  const logged: { msg: string }[] = [];
  const logger = pino({ level: "debug" }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string }) });
  return { logger, msgs: () => logged.map((l) => l.msg) };
}

describe("the daemon's epoch floor", () => {
  it("is the higher of the published epoch and the one participants saw, saying when participants saw the higher one", async () => {
    const { logger, msgs } = capture();
    expect(await highestEpochInUse({ published: () => 12, seen: async () => 40 }, logger)).toBe(40);
    expect(msgs()).toEqual(["participants_saw_unpublished_epoch"]);
    expect(await highestEpochInUse({ published: () => 50, seen: async () => 40 }, logger)).toBe(50);
  });

  it("a source that fails counts as 0, logged; the other still counts", async () => {
    const { logger, msgs } = capture();
    const unreadable = () => {
      throw new Error("EACCES");
    };
    expect(await highestEpochInUse({ published: unreadable, seen: async () => 40 }, logger)).toBe(40);
    expect(await highestEpochInUse({ published: () => 12, seen: async () => Promise.reject(new Error("registry")) }, logger)).toBe(12);
    expect(msgs()).toEqual(["epoch_floor_unreadable", "participants_saw_unpublished_epoch", "participant_epochs_unread"]);
  });

  it("a published epoch no revision can pass (a hand-edited checkpoint.json at 2^53 - 1) does not hide the participants' epochs", async () => {
    const { logger, msgs } = capture();
    // Before: the floor was 2^53 - 1, which the lease ignores whole: the leader took a revision below
    // 40 and the participants that saw 40 refused it (stale_epoch).
    expect(await highestEpochInUse({ published: () => Number.MAX_SAFE_INTEGER, seen: async () => 40 }, logger)).toBe(40);
    expect(msgs()).toContain("published_epoch_out_of_range_ignored");
  });
});
