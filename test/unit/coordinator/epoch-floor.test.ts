import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { highestEpochInUse } from "../../../coordinator/daemon/epoch-floor.js";

function capture() {
  const logged: { msg: string }[] = [];
  const logger = pino({ level: "debug" }, { write: (line: string) => void logged.push(JSON.parse(line) as { msg: string }) });
  return { logger, msgs: () => logged.map((l) => l.msg) };
}

/** No journal entry. */
const none = async () => 0;

describe("the daemon's epoch floor", () => {
  it("is the higher of the published epoch and the one participants saw, saying when participants saw the higher one", async () => {
    const { logger, msgs } = capture();
    expect(await highestEpochInUse({ published: () => 12, seen: async () => 40, journaled: none }, logger)).toBe(40);
    expect(msgs()).toEqual(["participants_saw_unpublished_epoch"]);
    expect(await highestEpochInUse({ published: () => 50, seen: async () => 40, journaled: none }, logger)).toBe(50);
  });

  it("a source that fails counts as 0, logged; the other still counts", async () => {
    const { logger, msgs } = capture();
    const unreadable = () => {
      throw new Error("EACCES");
    };
    expect(await highestEpochInUse({ published: unreadable, seen: async () => 40, journaled: none }, logger)).toBe(40);
    expect(await highestEpochInUse({ published: () => 12, seen: async () => Promise.reject(new Error("registry")), journaled: none }, logger)).toBe(12);
    expect(msgs()).toEqual(["epoch_floor_unreadable", "participants_saw_unpublished_epoch", "participant_epochs_unread"]);
  });

  it("a published epoch no revision can pass (a hand-edited checkpoint.json at 2^53 - 1) does not hide the participants' epochs", async () => {
    const { logger, msgs } = capture();
    // Before: the floor was 2^53 - 1, which the lease ignores whole: the leader took a revision below
    // 40 and the participants that saw 40 refused it (stale_epoch).
    expect(await highestEpochInUse({ published: () => Number.MAX_SAFE_INTEGER, seen: async () => 40, journaled: none }, logger)).toBe(40);
    expect(msgs()).toContain("published_epoch_out_of_range_ignored");
  });

  it("counts the journal's epochs: a journaled decision of a term that published nothing, whose participants did not answer the probe, still lifts the new leader above it", async () => {
    const { logger, msgs } = capture();
    // Before: 40, and the re-driven commit went to participants that saw 90 under an epoch they refuse (stale_epoch).
    expect(await highestEpochInUse({ published: () => 12, seen: async () => 40, journaled: async () => 90 }, logger)).toBe(90);
    expect(msgs()).toEqual(["participants_saw_unpublished_epoch", "journal_holds_higher_epoch"]);
    expect(await highestEpochInUse({ published: () => 120, seen: async () => 40, journaled: async () => 90 }, logger)).toBe(120);
  });

  it("a journal that cannot be read counts as 0, logged, and so does a journaled epoch no revision can pass; the others still count", async () => {
    const { logger, msgs } = capture();
    expect(await highestEpochInUse({ published: () => 12, seen: async () => 0, journaled: async () => Promise.reject(new Error("timeout")) }, logger)).toBe(12);
    expect(await highestEpochInUse({ published: () => 12, seen: async () => 40, journaled: async () => Number.MAX_SAFE_INTEGER }, logger)).toBe(40);
    expect(msgs()).toEqual(["journal_epochs_unread", "journaled_epoch_out_of_range_ignored", "participants_saw_unpublished_epoch"]);
  });
});
