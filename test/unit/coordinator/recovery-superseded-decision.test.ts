import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FOUR_KINDS, journalEntry, makeEngine, writers } from "./fake-participants.js";

/**
 * A checkpoint opens only once the one before it closed, so a decided entry older than another is
 * one its leader closed unpublished (its publication failed and so did the decision's withdrawal).
 * Recovery completed it all the same: it published a checkpoint its controller was told had failed,
 * its retention deleted the newer decision's files as a partial checkpoint, and the newer decision
 * was then resumed as overtaken (or, published from a participant's reply cache, named files that
 * were gone).
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-recovery-retention-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("recovery of two decided entries", () => {
  it("closes the older one unpublished (its leader closed it before the newer opened) and completes the newer into its own files", async () => {
    const { engine, journal, writer } = makeEngine(root);
    const participants = FOUR_KINDS.map((m) => ({ ...m }));
    // A decision whose withdrawal failed (its entry outlived its close), and the next checkpoint,
    // decided by a later term, whose leader died before publishing it: its files are on disk.
    await journal.record(journalEntry({ checkpoint_id: "older", state: "decided", participants, epoch: 3, prepared_at: 1, updated_at: 1 }));
    await journal.record(journalEntry({ checkpoint_id: "newer", state: "decided", participants, epoch: 4, prepared_at: 2, updated_at: 2 }));
    await mkdir(join(root, "newer", "gym"), { recursive: true });
    await writeFile(join(root, "newer", "gym", "committed-by-its-leader"), "");

    const recovered = await engine.recover();
    await writer.settled();
    expect(recovered).toEqual([
      { checkpoint_id: "older", action: "superseded_closed" },
      { checkpoint_id: "newer", action: "committed_published_resumed" },
    ]);
    expect(await readFile(join(root, "LATEST"), "utf8")).toBe("newer\n");
    expect(existsSync(join(root, "newer", "gym", "committed-by-its-leader"))).toBe(true);
    expect(existsSync(join(root, "newer", "checkpoint.json"))).toBe(true);
  });
});
