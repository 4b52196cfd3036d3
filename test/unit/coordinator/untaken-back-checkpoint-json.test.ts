import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { toCheckpointError } from "../../../protocol/index.js";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { makeEngine, writers } from "./fake-participants.js";

/**
 * A checkpoint.json renamed into place whose directory's fsync failed, and which could neither be
 * removed nor have its directory renamed away (three storage failures): the checkpoint keeps it
 * until it is taken back. Two consequences, one harness (the failing fs below):
 *
 * 1. A publish op so failed leaves the checkpoint committed and open: the controller retries the
 *    publish once the storage answers. That retry published it (LATEST named it), and the retention
 *    right after it trashed the whole checkpoint directory, marked for it by the first attempt.
 * 2. A checkpoint op so failed is aborted with the file left on disk; then leadership moves. The
 *    journal entry went at the abort's close and the writer's in-memory list of ids to take back was
 *    emptied by the lost leadership: the successor listed the aborted checkpoint as published and
 *    restorable by id, and its retention counted it among the newest N, deleting an older checkpoint
 *    that was truly published in its place.
 * 3. While the file stays (at its leader, or at a successor whose recovery could not take it back
 *    either), `list` and `get` served it as a published checkpoint, and a retried `checkpoint` or
 *    `publish` of its id was answered from it as published.
 */
const faults = vi.hoisted(() => ({ on: false, dir: "" }));
const eio = (what: string) => Object.assign(new Error(`EIO: i/o error, ${what}`), { code: "EIO", errno: -5, syscall: what.split(" ")[0] });
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const actual = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  return {
    ...actual,
    // checkpoint.json renamed into place, then its directory's fsync fails.
    replaceSmallFileDurably: async (...args: Parameters<typeof actual.replaceSmallFileDurably>) => {
      await actual.replaceSmallFileDurably(...args);
      if (faults.on && String(args[0]) === join(faults.dir, "checkpoint.json")) throw eio(`fsync '${faults.dir}'`);
    },
  };
});
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const rm = (async (...args: Parameters<typeof real.rm>) => {
    if (faults.on && String(args[0]) === join(faults.dir, "checkpoint.json")) throw eio(`unlink '${String(args[0])}'`);
    return real.rm(...args);
  }) as typeof real.rm;
  return withOverrides(real, { rm });
});
vi.mock("node:fs", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs")>();
  const renameSync = ((from: string, to: string) => {
    if (faults.on && String(from) === faults.dir) throw eio(`rename '${from}'`);
    return real.renameSync(from, to);
  }) as typeof real.renameSync;
  return withOverrides(real, { renameSync });
});

let root: string;
beforeEach(async () => {
  faults.on = false;
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-untaken-back-"));
});
afterEach(async () => {
  faults.on = false;
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("a publish retried after a failed one whose checkpoint.json could not be taken back", () => {
  it("publishes the checkpoint, LATEST names it, and its directory stays", async () => {
    const made = makeEngine(root);
    await made.engine.checkpoint({ checkpoint_id: "ok1", episode_ids: null, stop: false, controller_state: null });
    await made.engine.prepare({ checkpoint_id: "c2" });
    await made.engine.commit({ checkpoint_id: "c2", episode_ids: null, stop: false });
    faults.dir = join(root, "c2");
    faults.on = true;
    const refusal = await made.engine.publish({ checkpoint_id: "c2", controller_state: null }).then(
      () => undefined,
      (error: unknown) => toCheckpointError(error),
    );
    faults.on = false;
    expect(refusal?.code).toBe("storage_error");

    const reply = await made.engine.publish({ checkpoint_id: "c2", controller_state: null });
    expect(reply.checkpoint_id).toBe("c2");
    await made.writer.settled();
    expect(await made.catalog.latest()).toBe("c2");
    expect(existsSync(join(root, "c2", "checkpoint.json"))).toBe(true);
    expect((await verifyCheckpoint(made.catalog, "c2")).checkpoint_id).toBe("c2");
    await made.engine.resume({ checkpoint_id: "c2" });
  });
});

/** ok1 and ok2 published, then c3 aborted with its checkpoint.json left: the storage refuses every way of taking it back. */
async function abortedC3(options: { retention: number }) {
  const made = makeEngine(root, options);
  await made.engine.checkpoint({ checkpoint_id: "ok1", episode_ids: null, stop: false, controller_state: null });
  await made.engine.checkpoint({ checkpoint_id: "ok2", episode_ids: null, stop: false, controller_state: null });
  faults.dir = join(root, "c3");
  faults.on = true;
  const refusal = await made.engine.checkpoint({ checkpoint_id: "c3", episode_ids: null, stop: false, controller_state: null }).then(
    () => undefined,
    (error: unknown) => toCheckpointError(error),
  );
  expect(refusal?.code).toBe("storage_error");
  await made.writer.settled();
  // Every way of taking it back failed: the file is still there.
  expect(existsSync(join(root, "c3", "checkpoint.json"))).toBe(true);
  return made;
}

describe("an aborted checkpoint whose checkpoint.json could not be taken back, then a failover", () => {
  it("is taken back by the successor's recovery: not listed, not restorable, not counted by retention", async () => {
    const first = await abortedC3({ retention: 2 });
    faults.on = false;
    // The failover: the writer's memory of c3 goes with the leadership.
    first.engine.leadershipLost();
    first.leadership.demote();
    await first.writer.settled();

    const second = makeEngine(root, { successorOf: { fake: first.fake, journal: first.journal, clock: first.clock }, epoch: 8, requireRecovery: true, retention: 2 });
    await second.engine.recover();
    await second.writer.settled();
    expect(existsSync(join(root, "c3", "checkpoint.json"))).toBe(false);
    expect(first.journal.entries.has("c3")).toBe(false);
    expect((await second.engine.list()).checkpoints.map((c) => c.checkpoint_id)).not.toContain("c3");
    const restore = await second.engine.restore({ checkpoint_id: "c3", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }).then(
      () => undefined,
      (error: unknown) => toCheckpointError(error),
    );
    expect(restore?.code).toBe("not_found");

    // Retention keeps LATEST and the newest two published: ok4 and ok2, never the aborted c3 in ok2's place.
    await second.engine.checkpoint({ checkpoint_id: "ok4", episode_ids: null, stop: false, controller_state: null });
    await second.writer.settled();
    expect(existsSync(join(root, "ok2", "checkpoint.json"))).toBe(true);
    expect(existsSync(join(root, "ok1"))).toBe(false);
    // What its participants committed went with it, as any partial checkpoint's.
    expect(existsSync(join(root, "c3"))).toBe(false);
  });

  it("keeps the entry while the successor cannot take it back either; its retain and the next recovery finish it", async () => {
    const first = makeEngine(root, { retention: 2 });
    await first.engine.checkpoint({ checkpoint_id: "ok1", episode_ids: null, stop: false, controller_state: null });
    await first.engine.checkpoint({ checkpoint_id: "ok2", episode_ids: null, stop: false, controller_state: null });
    faults.dir = join(root, "c3");
    faults.on = true;
    const refusal = await first.engine.checkpoint({ checkpoint_id: "c3", episode_ids: null, stop: false, controller_state: null }).then(
      () => undefined,
      (error: unknown) => toCheckpointError(error),
    );
    expect(refusal?.code).toBe("storage_error");
    first.engine.leadershipLost();
    first.leadership.demote();
    await first.writer.settled();
    expect(first.journal.entries.get("c3")?.state).toBe("open");

    // The storage still refuses: the successor's recovery cannot take it back, and keeps the entry.
    const second = makeEngine(root, { successorOf: { fake: first.fake, journal: first.journal, clock: first.clock }, epoch: 8, requireRecovery: true, retention: 2 });
    await second.engine.recover();
    await second.writer.settled();
    expect(existsSync(join(root, "c3", "checkpoint.json"))).toBe(true);
    expect(first.journal.entries.get("c3")?.state).toBe("open");
    // Not restorable meanwhile (a restore's entry would replace the one kept to take it back).
    const restore = await second.engine.restore({ checkpoint_id: "c3", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }).then(
      () => undefined,
      (error: unknown) => toCheckpointError(error),
    );
    expect(restore?.code).toBe("not_found");
    expect(first.journal.entries.get("c3")?.state).toBe("open");

    // Once it answers, the successor's next retention takes it back before it counts the newest.
    faults.on = false;
    await second.engine.checkpoint({ checkpoint_id: "ok4", episode_ids: null, stop: false, controller_state: null });
    await second.writer.settled();
    expect(existsSync(join(root, "c3", "checkpoint.json"))).toBe(false);
    expect(existsSync(join(root, "ok2", "checkpoint.json"))).toBe(true);
    expect((await second.engine.list()).checkpoints.map((c) => c.checkpoint_id)).not.toContain("c3");

    // The entry goes at the next recovery, which finds nothing left to take back.
    second.engine.leadershipLost();
    second.leadership.demote();
    const third = makeEngine(root, { successorOf: { fake: first.fake, journal: first.journal, clock: first.clock }, epoch: 9, requireRecovery: true, retention: 2 });
    expect(await third.engine.recover()).toContainEqual({ checkpoint_id: "c3", action: "resumed" });
    await third.writer.settled();
    expect(first.journal.entries.has("c3")).toBe(false);
  });

  it("is taken back by recovery when its leader died after withdrawing the decision, before taking it back", async () => {
    const first = makeEngine(root, { retention: 2 });
    await first.engine.checkpoint({ checkpoint_id: "ok1", episode_ids: null, stop: false, controller_state: null });
    await first.engine.prepare({ checkpoint_id: "c2" });
    await first.engine.commit({ checkpoint_id: "c2", episode_ids: null, stop: false });
    // What the crash left: checkpoint.json renamed into place (its publication failed after), and
    // the decision withdrawn (the journal entry undecided again).
    const manifest = JSON.parse(readFileSync(join(root, "ok1", "checkpoint.json"), "utf8")) as { checkpoint_id: string };
    writeFileSync(join(root, "c2", "checkpoint.json"), `${JSON.stringify({ ...manifest, checkpoint_id: "c2" }, null, 2)}\n`);
    await first.journal.record({ ...first.journal.entries.get("c2")!, state: "open" });
    first.engine.leadershipLost();
    first.leadership.demote();
    await first.writer.settled();

    const second = makeEngine(root, { successorOf: { fake: first.fake, journal: first.journal, clock: first.clock }, epoch: 8, requireRecovery: true, retention: 2 });
    expect(await second.engine.recover()).toContainEqual({ checkpoint_id: "c2", action: "resumed" });
    await second.writer.settled();
    expect(existsSync(join(root, "c2", "checkpoint.json"))).toBe(false);
    expect(first.journal.entries.has("c2")).toBe(false);
    expect((await second.engine.list()).checkpoints.map((c) => c.checkpoint_id)).toEqual(["ok1"]);
    expect([...first.fake.state].filter(([, s]) => s.checkpoint_id === "c2")).toEqual([]);
  });
});

describe("an aborted checkpoint whose checkpoint.json is still there is never listed or served as published", () => {
  const refusalOf = (op: Promise<unknown>) =>
    op.then(
      () => undefined,
      (error: unknown) => toCheckpointError(error),
    );

  it("at its leader: not listed, get refuses it not_found, a retried publish is refused, not answered as published", async () => {
    const made = await abortedC3({ retention: 5 });
    const listing = await made.engine.list();
    expect(listing.checkpoints.map((c) => c.checkpoint_id)).toEqual(["ok2", "ok1"]);
    expect(listing.latest).toBe("ok2");
    expect(listing.damaged).toBeUndefined();
    expect((await refusalOf(made.engine.get({ checkpoint_id: "c3" })))?.code).toBe("not_found");
    expect((await refusalOf(made.engine.publish({ checkpoint_id: "c3", controller_state: null })))?.code).toBe("stale_checkpoint");
    expect(existsSync(join(root, "c3", "checkpoint.json"))).toBe(true);
  });

  it("at its leader, the storage still refusing at the next retention: not counted among the newest", async () => {
    const made = await abortedC3({ retention: 2 });
    await made.engine.checkpoint({ checkpoint_id: "ok4", episode_ids: null, stop: false, controller_state: null });
    await made.writer.settled();
    expect(existsSync(join(root, "c3", "checkpoint.json"))).toBe(true);
    // LATEST (ok4) and the newest published other than it (ok2): never c3 in ok2's place.
    expect(existsSync(join(root, "ok2", "checkpoint.json"))).toBe(true);
    expect(existsSync(join(root, "ok1"))).toBe(false);
    expect((await made.engine.list()).checkpoints.map((c) => c.checkpoint_id)).toEqual(["ok4", "ok2"]);
  });

  it("at a successor whose recovery could not take it back either: not listed, get not_found, retried ops refused, not answered as published", async () => {
    const first = await abortedC3({ retention: 5 });
    first.engine.leadershipLost();
    first.leadership.demote();
    await first.writer.settled();

    // The successor learns of it from the journal entry kept (undecided) and fails to take it back too.
    const second = makeEngine(root, { successorOf: { fake: first.fake, journal: first.journal, clock: first.clock }, epoch: 8, requireRecovery: true, retention: 5 });
    await second.engine.recover();
    await second.writer.settled();
    expect(existsSync(join(root, "c3", "checkpoint.json"))).toBe(true);
    expect(first.journal.entries.get("c3")?.state).toBe("open");
    expect((await second.engine.list()).checkpoints.map((c) => c.checkpoint_id)).toEqual(["ok2", "ok1"]);
    expect((await refusalOf(second.engine.get({ checkpoint_id: "c3" })))?.code).toBe("not_found");
    expect((await refusalOf(second.engine.checkpoint({ checkpoint_id: "c3", episode_ids: null, stop: false, controller_state: null })))?.code).toBe("stale_checkpoint");
    expect((await refusalOf(second.engine.publish({ checkpoint_id: "c3", controller_state: null })))?.code).toBe("stale_checkpoint");
    expect(first.journal.entries.get("c3")?.state).toBe("open");
  });
});
