import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startCoordinator } from "../../coordinator/daemon/coordinator-daemon.js";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { journalEntry } from "../unit/coordinator/fake-participants.js";
import { waitUntil } from "../support/wait-until.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";

// The daemon tells its journal whether a checkpoint is still in the catalog (the root held, its
// checkpoint.json there): a restore's outcome record stays while it is, and goes with it
// (docs/api.md, the journal bucket). The journal's side is decision-journal.test.ts; this is the
// daemon's wiring, through a leader's recovery, which compacts the markers.

let world: World;
beforeAll(async () => {
  world = await startWorld();
});
afterAll(async () => {
  await world?.close();
});

describe("a coordinator's compaction of restore outcome records", () => {
  it("keeps the record of a checkpoint whose checkpoint.json is under the root, and drops the one retention deleted", async () => {
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment); // a tool's: keeps every record
    const e1 = { kind: "environment" as const, instance: "env1" };
    for (const id of ["kept-1", "gone-1"]) {
      await journal.record(journalEntry({ checkpoint_id: id, state: "restore_cleanup", participants: [e1] }));
      await journal.remove(id, "restore_failed");
    }
    await mkdir(join(world.root, "kept-1"));
    await writeFile(join(world.root, "kept-1", "checkpoint.json"), "{}\n");
    const logged: Record<string, unknown>[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void logged.push(JSON.parse(line) as Record<string, unknown>) });
    const handle = await startCoordinator({ config: world.config(NO_HTTP), nc: await world.nats.connect(), logger, journalMarkerKeepMs: 0 });
    world.coordinators.push(handle);
    await handle.whenReady();
    // Its recovery's listing compacts (in the background): both records are past markerKeepMs.
    await waitUntil(() => logged.some((l) => l["msg"] === "journal_markers_dropped"), "the recovery's compaction", 10_000);
    expect(logged.find((l) => l["msg"] === "journal_markers_dropped")).toMatchObject({ markers: 1 });
    expect(await journal.restoreOutcome("gone-1")).toBeUndefined();
    expect(await journal.restoreOutcome("kept-1")).toBe("restore_failed");
    expect(logged.filter((l) => String(l["msg"]).startsWith("journal_restore_outcome"))).toEqual([]);
  });
});
