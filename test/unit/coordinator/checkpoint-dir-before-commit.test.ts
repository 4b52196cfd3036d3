import { existsSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

/**
 * The checkpoint directory exists before any commit is sent: a participant that does not see it (its
 * checkpoint storage not mounted on its host) refuses the commit instead of writing to its local disk.
 * The fake participants note, per commit, whether the directory was there when it arrived.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-dir-before-commit-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/**
 * Makes the staging's mkdir of checkpoint `id` fail (a file in the way, put there as the checkpoint
 * opens: after the prepare's own check of the path), then frees the path once that staging settled,
 * before the first prepare is sent; with `keep` the file stays.
 */
function failStagedMkdir(made: ReturnType<typeof makeEngine>, id: string, keep = false): void {
  const { journal, fake, writer } = made;
  const record = journal.record.bind(journal);
  journal.record = (entry) => {
    if (entry.checkpoint_id === id && entry.state === "open" && !existsSync(join(root, id))) writeFileSync(join(root, id), "");
    return record(entry);
  };
  if (keep) return;
  const request = fake.request.bind(fake);
  let freed = false;
  fake.request = async (subject, body, options) => {
    if (!freed && subject.endsWith(".prepare")) {
      freed = true;
      await writer.settled(); // the staging failed
      await rm(join(root, id));
    }
    return request(subject, body, options);
  };
}

describe("the checkpoint directory exists when the first commit arrives", () => {
  it("commit op: its staged mkdir failed during the prepare, so it is made again before the commits", async () => {
    const made = makeEngine(root);
    failStagedMkdir(made, "c1");
    await made.engine.prepare({ checkpoint_id: "c1" });
    await made.engine.commit({ checkpoint_id: "c1", episode_ids: null, stop: false });
    expect(made.fake.commitSawDir).toEqual(Array(5).fill(true));
  });

  it("checkpoint op: the same, and the checkpoint is published", async () => {
    const made = makeEngine(root);
    failStagedMkdir(made, "c2");
    const reply = await made.engine.checkpoint({ checkpoint_id: "c2", episode_ids: null, stop: false, controller_state: null });
    expect(made.fake.commitSawDir).toEqual(Array(5).fill(true));
    expect(reply.checkpoint_id).toBe("c2");
    expect(await made.catalog.latest()).toBe("c2");
  });

  it("a mkdir that fails again refuses the commit before its decision: no commit sent, still prepared", async () => {
    const made = makeEngine(root);
    failStagedMkdir(made, "c3", true);
    await made.engine.prepare({ checkpoint_id: "c3" });
    const refusal = await refusalOf(made.engine.commit({ checkpoint_id: "c3", episode_ids: null, stop: false }));
    expect(refusal.code).toBe("checkpoint_conflict");
    expect({ commits: made.fake.ops("commit").length, entry: made.journal.entries.get("c3")?.state, phase: made.engine.openCheckpoint?.phase }).toEqual({
      commits: 0,
      entry: "open",
      phase: "prepared",
    });
    // Once the path is free the same commit goes ahead.
    await rm(join(root, "c3"));
    await made.engine.commit({ checkpoint_id: "c3", episode_ids: null, stop: false });
    expect(made.fake.commitSawDir).toEqual(Array(5).fill(true));
  });

  it("a successor re-driving a decided commit makes the missing directory first", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "c4" });
    await first.engine.commit({ checkpoint_id: "c4", episode_ids: null, stop: false });
    const entry = structuredClone(first.journal.entries.get("c4")!);
    expect(entry.state).toBe("decided");
    await first.writer.settled();
    await rm(join(root, "c4"), { recursive: true }); // e.g. its creation lost with the predecessor's host
    const second = makeEngine(root);
    await second.journal.record(entry);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "c4", action: "committed" }]);
    expect(second.fake.commitSawDir).toEqual(Array(5).fill(true));
    expect(existsSync(join(root, "c4"))).toBe(true);
  });
});
