import { readlinkSync, writeFileSync } from "node:fs";
import { mkdir, mkdtemp, open, readFile, readdir, rm, symlink, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CheckpointError, CheckpointIdSchema, GlobalManifestSchema, PARTICIPANTS_DIR, ROLLOUTS_DIR, sha256Hex, toCheckpointError } from "../../../protocol/index.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { LEFTOVER_TEMP_AGE_MS } from "../../../coordinator/publication/retention.js";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { writeParticipant } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

// A full disk for checkpoint.json's write: while `full`, the blocking writes into a checkpoint.json
// temp file fail with a real ENOSPC (written to /dev/full), which names no path. (LATEST's temp file,
// staged before, is written blocking too; a publication that stages it late must get that far.)
// While `statFails`, a stat of a checkpoint.json fails as a storage that stops answering does (EIO).
// While `dirOpenFails` names a directory, opening it (for its fsync) fails with EIO.
// `fsynced`: the directories fsynced through durable-fs's fsyncDirectory, in order; while
// `fsyncFails` names one, its fsync there fails with EIO.
// `latestLinksAtRename`: the link count of the LATEST each rename onto it replaced (0: none yet).
// While `rmFails` names a path, removing it (fs/promises rm) fails with EIO.
const disk = vi.hoisted(() => ({
  full: false,
  statFails: false,
  dirOpenFails: undefined as string | undefined,
  rmFails: undefined as string | undefined,
  renameFails: undefined as string | undefined,
  fsynced: [] as string[],
  fsyncFails: undefined as string | undefined,
  latestLinksAtRename: [] as number[],
  manifestFds: new Set<number>(),
}));
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const rm = (async (...args: Parameters<typeof real.rm>) => {
    if (disk.rmFails !== undefined && String(args[0]) === disk.rmFails) throw Object.assign(new Error(`EIO: i/o error, unlink '${String(args[0])}'`), { code: "EIO", syscall: "unlink" });
    return real.rm(...args);
  }) as typeof real.rm;
  return withOverrides(real, { rm });
});
vi.mock("node:fs", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs")>();
  const writeSync = ((...args: Parameters<typeof real.writeSync>) => {
    if (!disk.full || !disk.manifestFds.has(args[0])) return (real.writeSync as (...a: unknown[]) => number)(...args);
    const fd = real.openSync("/dev/full", "w");
    try {
      return real.writeSync(fd, "x");
    } finally {
      real.closeSync(fd);
    }
  }) as typeof real.writeSync;
  const statSync = ((...args: Parameters<typeof real.statSync>) => {
    if (disk.statFails && String(args[0]).endsWith("checkpoint.json")) throw Object.assign(new Error(`EIO: i/o error, stat '${String(args[0])}'`), { code: "EIO", syscall: "stat" });
    return (real.statSync as (...a: unknown[]) => unknown)(...args);
  }) as typeof real.statSync;
  const openSync = ((...args: Parameters<typeof real.openSync>) => {
    if (disk.dirOpenFails !== undefined && String(args[0]) === disk.dirOpenFails) throw Object.assign(new Error(`EIO: i/o error, open '${String(args[0])}'`), { code: "EIO", syscall: "open" });
    const fd = (real.openSync as (...a: unknown[]) => number)(...args);
    if (String(args[0]).includes("/.checkpoint.json.")) disk.manifestFds.add(fd);
    return fd;
  }) as typeof real.openSync;
  const closeSync = ((fd: number) => {
    disk.manifestFds.delete(fd);
    return real.closeSync(fd);
  }) as typeof real.closeSync;
  const renameSync = ((from: string, to: string) => {
    if (disk.renameFails !== undefined && String(from) === disk.renameFails) throw Object.assign(new Error(`EIO: i/o error, rename '${from}'`), { code: "EIO", syscall: "rename" });
    if (String(to).endsWith("/LATEST")) disk.latestLinksAtRename.push(real.existsSync(to) ? real.statSync(to).nlink : 0);
    return real.renameSync(from, to);
  }) as typeof real.renameSync;
  return withOverrides(real, { writeSync, statSync, openSync, closeSync, renameSync });
});

vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  const fsyncDirectory = async (dir: string) => {
    disk.fsynced.push(dir);
    if (disk.fsyncFails === dir) throw Object.assign(new Error(`EIO: i/o error, fsync '${dir}'`), { code: "EIO", syscall: "fsync" });
    return original.fsyncDirectory(dir);
  };
  return { ...original, fsyncDirectory };
});

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-pub-"));
});
afterEach(async () => {
  disk.full = false;
  disk.statFails = false;
  disk.dirOpenFails = undefined;
  disk.rmFails = undefined;
  disk.renameFails = undefined;
  disk.fsynced = [];
  disk.fsyncFails = undefined;
  await rm(root, { recursive: true, force: true });
});

/** The catalog error of a publication that must fail (a storage failure maps to storage_error); a success fails the test. */
async function refusedPublication(writer: GlobalManifestWriter, id: string, at: number): Promise<CheckpointError> {
  const failure = await publish(writer, id, at).then(
    () => new Error(`expected the publication of ${id} to fail`),
    (error: unknown) => ({ error }),
  );
  if (failure instanceof Error) throw failure;
  return toCheckpointError(failure.error);
}

/**
 * A publication of `id` whose checkpoint.json is renamed in, but whose directory's fsync fails and
 * which neither the removal of checkpoint.json nor the directory's rename can take back (storage_error).
 */
async function publicationNothingTakesBack(writer: GlobalManifestWriter, catalog: CheckpointCatalog, id: string, at: number): Promise<void> {
  disk.dirOpenFails = catalog.dirFor(id);
  disk.rmFails = join(catalog.dirFor(id), "checkpoint.json");
  disk.renameFails = catalog.dirFor(id);
  try {
    expect((await refusedPublication(writer, id, at)).code).toBe("storage_error");
  } finally {
    disk.dirOpenFails = undefined;
    disk.rmFails = undefined;
    disk.renameFails = undefined;
  }
}

async function publish(writer: GlobalManifestWriter, id: string, at: number, state: unknown = null, beforeWrite?: () => void) {
  const entries = [
    await writeParticipant(root, id, "model", "m1", ['{"episode_id":{"rollout_id":"r1","attempt":0},"x":1}', '{"episode_id":{"rollout_id":"r2","attempt":1}}']),
    await writeParticipant(root, id, "agent", "a1", []),
  ];
  return writer.publish({
    checkpointId: id,
    epoch: 4,
    preparedAt: at - 1,
    publishedAt: at,
    stop: false,
    scope: null,
    restarts: ["r9"],
    participants: entries,
    controllerState: state as never,
    ...(beforeWrite && { beforeWrite }),
  });
}

describe("publication and retention", () => {
  it("a publication that fails reading back its checkpoint.json fails before LATEST names it (never a failed publish that is LATEST)", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    disk.statFails = true;
    expect((await refusedPublication(writer, "c2", 1010)).code).toBe("storage_error");
    disk.statFails = false;
    expect(await catalog.latest()).toBe("c1");
  });

  it("a LATEST that is a symbolic link is refused (invalid_checkpoint_state), not read through; the next publication replaces the link", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    await writeFile(join(root, "elsewhere"), "c1\n");
    await rm(join(root, "LATEST"));
    await symlink(join(root, "elsewhere"), join(root, "LATEST"));
    expect(await refusalOf(catalog.latest())).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("symbolic link") });
    await publish(writer, "c2", 1010);
    expect(await catalog.latest()).toBe("c2");
    expect(await readFile(join(root, "elsewhere"), "utf8")).toBe("c1\n");
  });

  it("a root whose fsync fails while LATEST's temp file is staged: the publication fails and the staged temp file does not stay behind", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    disk.dirOpenFails = root;
    expect((await refusedPublication(writer, "c2", 1010)).code).toBe("storage_error");
    disk.dirOpenFails = undefined;
    await writer.settled();
    expect((await readdir(root)).filter((name) => name.includes("LATEST"))).toEqual(["LATEST"]);
    expect(await catalog.latest()).toBe("c1");
  });

  it("a checkpoint.json whose directory's fsync fails after its rename is taken back: the failed publication is not listed as published", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    disk.dirOpenFails = catalog.dirFor("c2");
    expect((await refusedPublication(writer, "c2", 1010)).code).toBe("storage_error");
    disk.dirOpenFails = undefined;
    expect(await readdir(catalog.dirFor("c2"))).not.toContain("checkpoint.json");
    const fresh = new CheckpointCatalog(root);
    expect(await fresh.latest()).toBe("c1");
    expect(fresh.has("c2")).toBe(false);
    expect(fresh.scan().partial).toContain("c2");
  });

  it("a checkpoint.json taken back has its removal made durable: its directory is fsynced after it", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    disk.dirOpenFails = catalog.dirFor("c2");
    disk.fsynced = [];
    expect((await refusedPublication(writer, "c2", 1010)).code).toBe("storage_error");
    disk.dirOpenFails = undefined;
    expect(await readdir(catalog.dirFor("c2"))).not.toContain("checkpoint.json");
    // Without it, a crash before the directory reaches the disk brings the aborted checkpoint.json back.
    expect(disk.fsynced).toContain(catalog.dirFor("c2"));
  });

  it("a checkpoint.json whose removal's fsync fails is taken away with its directory", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    disk.dirOpenFails = catalog.dirFor("c2");
    disk.fsyncFails = catalog.dirFor("c2");
    expect((await refusedPublication(writer, "c2", 1010)).code).toBe("storage_error");
    disk.dirOpenFails = undefined;
    disk.fsyncFails = undefined;
    // Renamed into the trash at the root (and the root fsynced): no crash brings it back as c2.
    expect(await readdir(root)).not.toContain("c2");
    expect(disk.fsynced.at(-1)).toBe(root);
    const fresh = new CheckpointCatalog(root);
    expect(fresh.has("c2")).toBe(false);
    expect(await fresh.latest()).toBe("c1");
  });

  it("a checkpoint.json whose directory's fsync fails and whose removal fails too is taken away with its directory: the aborted checkpoint is neither listed, restorable by id nor kept by retention", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    disk.dirOpenFails = catalog.dirFor("c2");
    disk.rmFails = join(catalog.dirFor("c2"), "checkpoint.json");
    expect((await refusedPublication(writer, "c2", 1010)).code).toBe("storage_error");
    disk.dirOpenFails = undefined;
    disk.rmFails = undefined;
    const fresh = new CheckpointCatalog(root);
    expect(await fresh.latest()).toBe("c1");
    expect(fresh.has("c2")).toBe(false);
    expect(fresh.scan().published.map((e) => e.checkpoint_id)).toEqual(["c1"]);
    expect(fresh.newest()?.checkpoint_id).toBe("c1");
    expect((await refusalOf(fresh.get("c2"))).code).toBe("not_found");
    // Retention (keep 2) keeps c1 beside c3, rather than counting the aborted c2 as the newer one.
    await publish(writer, "c3", 1020);
    expect(writer.retain("c3")).toEqual([]);
    await writer.settled();
    expect((await readdir(root)).sort()).toEqual(["LATEST", "c1", "c3"]);
  });

  it("a checkpoint.json that neither its removal nor its directory's rename could take back is taken away before the next retention counts it", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    await publicationNothingTakesBack(writer, catalog, "c2", 1010);
    await publish(writer, "c3", 1020);
    expect(writer.retain("c3")).toEqual([]);
    await writer.settled();
    expect((await readdir(root)).sort()).toEqual(["LATEST", "c1", "c3"]);
  });

  it("a checkpoint.json nothing could take back, whose publication a retry then completes (the separate publish op), is LATEST and kept: retention does not take it away", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 1000);
    await publicationNothingTakesBack(writer, catalog, "c2", 1010);
    // The controller retries the publish of its still committed checkpoint once the storage answers.
    await publish(writer, "c2", 1011);
    expect(await catalog.latest()).toBe("c2");
    expect(writer.retain("c2")).toEqual([]);
    await writer.settled();
    expect((await readdir(root)).sort()).toEqual(["LATEST", "c1", "c2"]);
    expect((await verifyCheckpoint(new CheckpointCatalog(root), "c2")).records).toBe(2);
  });

  it("writes checkpoint.json, then LATEST; keeps the newest N and deletes partial checkpoints", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await mkdir(join(root, "partial-one", "gym"), { recursive: true });
    await publish(writer, "c1", 100);
    await publish(writer, "c2", 200);
    await publish(writer, "c3", 300, { inline: { tokens: 5 } });
    expect(writer.retain("c3")).toEqual(["c1", "partial-one"]);
    expect((await readdir(root)).filter((n) => !n.startsWith(".")).sort()).toEqual(["LATEST", "c2", "c3"]);
    expect((await readFile(join(root, "LATEST"), "utf8")).trim()).toBe("c3");
    const m = await catalog.get("c3");
    expect(m.epoch).toBe(4);
    expect(m.controller_state).toEqual({ inline: { tokens: 5 } });
    expect(m.participants.map((p) => p.kind)).toEqual(["agent", "model"]);
    // The writer does not re-parse what it writes (its inputs were validated where they entered);
    // the file on disk must still be exactly what every reader's strict schema accepts.
    const onDisk = JSON.parse(await readFile(join(root, "c3", "checkpoint.json"), "utf8"));
    expect(GlobalManifestSchema.parse(onDisk)).toEqual(onDisk);
    expect(onDisk).toEqual(m);
    expect(catalog.scan().published.map((e) => e.checkpoint_id)).toEqual(["c3", "c2"]);
  });

  it("the LATEST a publication replaces has a second link when the rename replaces it (its inode is freed in the background, not inside the rename), and that link goes", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    disk.latestLinksAtRename.length = 0;
    await publish(writer, "c1", 100);
    await publish(writer, "c2", 200);
    await publish(writer, "c3", 300);
    expect(disk.latestLinksAtRename).toEqual([0, 2, 2]);
    await writer.settled();
    expect((await readdir(root)).filter((n) => n.startsWith(".trash-"))).toEqual([]);
    expect(await catalog.latest()).toBe("c3");
  });

  it("leadership lost while checkpoint.json's fsync waits: neither checkpoint.json nor LATEST is written", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 100);
    let checks = 0;
    const demoted = () => {
      if (++checks === 2) throw new Error("not the leader any more"); // the check after the fsync
    };
    await expect(publish(writer, "c2", 200, null, demoted)).rejects.toThrow("not the leader any more");
    expect(checks).toBe(2);
    expect((await readdir(join(root, "c2"))).sort()).toEqual(["gym"]); // no checkpoint.json, no temp file
    expect((await readFile(join(root, "LATEST"), "utf8")).trim()).toBe("c1");
    await writer.settled();
    expect((await readdir(root)).filter((n) => n.startsWith("."))).toEqual([]);
  });

  it("leadership lost while checkpoint.json's directory fsync waits (after its rename): the deposed writer leaves checkpoint.json, which a successor may already have made LATEST", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 100);
    let checks = 0;
    const deposed = () => {
      if (++checks < 3) return; // before the write and before checkpoint.json's rename: still the leader
      // The check before LATEST's rename, after the directory fsync stalled past the lease: a
      // successor has since recovered the journaled decision, found checkpoint.json and pointed
      // LATEST at it (repairLatest).
      if (checks === 3) writeFileSync(join(root, "LATEST"), "c2\n");
      throw new Error("not the leader any more");
    };
    await expect(publish(writer, "c2", 200, null, deposed)).rejects.toThrow("not the leader any more");
    await writer.settled();
    // LATEST names a whole checkpoint: the deposed writer did not take back the file it names.
    const fresh = new CheckpointCatalog(root);
    expect(await fresh.latest()).toBe("c2");
    expect((await fresh.get("c2")).checkpoint_id).toBe("c2");
    expect((await verifyCheckpoint(fresh, "c2")).records).toBe(2);
    expect((await readdir(root)).filter((n) => n.startsWith("."))).toEqual([]); // its LATEST temp file is gone
  });

  it("a checkpoint.json the disk refuses (ENOSPC) is storage_error naming its file; LATEST stays", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 100);
    disk.full = true;
    const refusal = await refusedPublication(writer, "c2", 200);
    disk.full = false;
    expect(refusal.code).toBe("storage_error");
    expect(refusal.message).toMatch(new RegExp(`^ENOSPC: no space left on device, write '${join(root, "c2")}/\\.checkpoint\\.json\\.[^']+\\.tmp'$`));
    expect((await readdir(join(root, "c2"))).sort()).toEqual(["gym"]); // no checkpoint.json, no temp file
    expect((await readFile(join(root, "LATEST"), "utf8")).trim()).toBe("c1");
    await writer.settled();
  });

  it("a LATEST the root holds as a directory (its rename refused, EISDIR) is storage_error, as documented; checkpoint.json is taken back", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await mkdir(join(root, "LATEST", "kept"), { recursive: true });
    const refusal = await refusedPublication(writer, "c1", 100);
    expect(refusal.code).toBe("storage_error");
    expect(refusal.message).toContain("EISDIR");
    expect((await readdir(join(root, "c1"))).sort()).toEqual(["gym"]); // no checkpoint.json: nothing published
    expect(await readdir(join(root, "LATEST"))).toEqual(["kept"]);
    await writer.settled();
  });

  it("deletes only recognisable partial checkpoints; a controller's directory at the root is left and not listed", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    // `gym-ckpt collect --records-dir <root>` writes <root>/rollouts/step_<N>/…: id-shaped, no checkpoint.json.
    await mkdir(join(root, ROLLOUTS_DIR, "step_1"), { recursive: true });
    await writeFile(join(root, ROLLOUTS_DIR, "x.jsonl"), '{"row":1}\n');
    await mkdir(join(root, "opened-empty")); // opened, aborted before any commit
    await mkdir(join(root, "committed-unpublished", PARTICIPANTS_DIR, "model", "m1"), { recursive: true });
    await writeFile(join(root, "committed-unpublished", PARTICIPANTS_DIR, "model", "m1", "manifest.json"), "{}");
    expect(catalog.scan().partial).toEqual(["committed-unpublished", "opened-empty"]);
    await publish(writer, "c1", 100);
    expect(writer.retain("c1")).toEqual(["committed-unpublished", "opened-empty"]);
    await writer.settled();
    expect((await readdir(root)).sort()).toEqual(["LATEST", "c1", ROLLOUTS_DIR]);
    expect(await readFile(join(root, ROLLOUTS_DIR, "x.jsonl"), "utf8")).toBe('{"row":1}\n');
    expect(catalog.scan()).toEqual({ published: [expect.objectContaining({ checkpoint_id: "c1" })], partial: [], damaged: [] });
  });

  it("a checkpoint named as the collector's records directory cannot be opened, so retention never trashes the records with it", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    // `collect --records-dir <root>`'s records, and what a commit of a checkpoint "rollouts" writes beside them.
    await mkdir(join(root, ROLLOUTS_DIR, "step_1"), { recursive: true });
    await writeFile(join(root, ROLLOUTS_DIR, "step_1", "train_rollouts_x.jsonl"), '{"row":1}\n');
    await mkdir(join(root, ROLLOUTS_DIR, PARTICIPANTS_DIR, "model", "m1"), { recursive: true });
    expect(CheckpointIdSchema.safeParse(ROLLOUTS_DIR).success).toBe(false);
    await publish(writer, "c1", 100);
    expect(writer.retain("c1")).toEqual([]);
    await writer.settled();
    expect(await readFile(join(root, ROLLOUTS_DIR, "step_1", "train_rollouts_x.jsonl"), "utf8")).toBe('{"row":1}\n');
  });

  it("an empty directory written into after retention's scan (collect --records-dir <root> making its first step) is left with what it holds", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await mkdir(join(root, ROLLOUTS_DIR)); // made at the collector's start, empty until its first records step
    await publish(writer, "c1", 100);
    // Another process (the collector) writes its first step right after the scan saw rollouts/ empty.
    const scan = catalog.scan.bind(catalog);
    vi.spyOn(catalog, "scan").mockImplementation(() => {
      const found = scan();
      writeFileSync(join(root, ROLLOUTS_DIR, "step_1.jsonl"), '{"row":1}\n');
      return found;
    });
    expect(writer.retain("c1")).toEqual([]);
    await writer.settled();
    expect(await readFile(join(root, ROLLOUTS_DIR, "step_1.jsonl"), "utf8")).toBe('{"row":1}\n');
  });

  it("an empty directory still empty when retention reaches it is removed", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await mkdir(join(root, "opened-empty"));
    await publish(writer, "c1", 100);
    expect(writer.retain("c1")).toEqual(["opened-empty"]);
    await writer.settled();
    expect((await readdir(root)).sort()).toEqual(["LATEST", "c1"]);
  });

  it("orders checkpoints by epoch before publication time: a successor whose clock lags keeps its own newest", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    const at = async (id: string, epoch: number, publishedAt: number) => {
      const entries = [await writeParticipant(root, id, "agent", "a1", [])];
      await writer.publish({ checkpointId: id, epoch, preparedAt: publishedAt - 1, publishedAt, stop: false, scope: null, restarts: [], participants: entries, controllerState: null });
    };
    await at("c1", 4, 1000);
    await at("c2", 4, 1010);
    // A failover to a coordinator whose wall clock is a few minutes behind: epoch 5, earlier timestamps.
    await at("c3", 5, 900);
    expect(writer.retain("c3")).toEqual(["c1"]);
    await at("c4", 5, 910);
    // c3 is the checkpoint before LATEST, the one to fall back to: c2 goes, not c3.
    expect(writer.retain("c4")).toEqual(["c2"]);
    expect(catalog.scan().published.map((e) => e.checkpoint_id)).toEqual(["c4", "c3"]);
    await writer.settled();
  });

  it("highestEpoch (the lease's epoch floor) leaves out a checkpoint.json whose epoch no revision can pass (hand-edited 2^53 - 1): the other published epochs still count", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const at = async (id: string, epoch: number, publishedAt: number) => {
      const entries = [await writeParticipant(root, id, "agent", "a1", [])];
      await writer.publish({ checkpointId: id, epoch, preparedAt: publishedAt - 1, publishedAt, stop: false, scope: null, restarts: [], participants: entries, controllerState: null });
    };
    await at("c1", 50, 1000);
    await at("c2", Number.MAX_SAFE_INTEGER, 1010);
    // Before: 2^53 - 1, which highestEpochInUse counts as 0 whole: a new leader after the leader
    // bucket was recreated took a revision below 50 and ranked its checkpoints below c1.
    expect(catalog.highestEpoch()).toBe(50);
    await writer.settled();
  });

  it("recovery's LATEST repair never moves LATEST back past what the storage refuses to read (EIO), but repairs a damaged one", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    await publish(writer, "c1", 100);
    await publish(writer, "c2", 200); // LATEST = c2; c1's journal entry outlived its close
    const eio = (path: string) => Object.assign(new Error(`EIO: i/o error, open '${path}'`), { code: "EIO", syscall: "open", errno: -5 });
    const get = catalog.get.bind(catalog);
    const refuseC2 = vi.spyOn(catalog, "get").mockImplementation((id) => (id === "c2" ? Promise.reject(eio(join(root, "c2", "checkpoint.json"))) : get(id)));
    await expect(writer.repairLatest("c1")).rejects.toMatchObject({ code: "EIO" });
    expect(await catalog.latest()).toBe("c2");
    refuseC2.mockRestore();
    const refuseLatest = vi.spyOn(catalog, "latest").mockRejectedValue(eio(join(root, "LATEST")));
    await expect(writer.repairLatest("c1")).rejects.toMatchObject({ code: "EIO" });
    refuseLatest.mockRestore();
    expect(await catalog.latest()).toBe("c2");
    expect(await writer.repairLatest("c1")).toBe("superseded");
    // Damage (not the storage's refusal) is still repaired: LATEST goes to the checkpoint that is whole.
    await writeFile(join(root, "c2", "checkpoint.json"), "{");
    expect(await writer.repairLatest("c1")).toBe("repaired");
    expect(await catalog.latest()).toBe("c1");
    await writer.settled();
  });

  it("recovery's LATEST repair checks leadership right before its rename: deposed meanwhile, LATEST is left as it is", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    await publish(writer, "c1", 100);
    await publish(writer, "c2", 200);
    await writeFile(join(root, "c2", "checkpoint.json"), "{"); // damaged: a repair would point LATEST at c1
    let checks = 0;
    const deposedAfterFirstCheck = () => {
      if (++checks > 1) throw new CheckpointError("not_leader", "deposed (scripted)");
    };
    await expect(writer.repairLatest("c1", deposedAfterFirstCheck)).rejects.toMatchObject({ code: "not_leader" });
    expect(checks).toBe(2);
    expect(await catalog.latest()).toBe("c2");
    expect((await readdir(root)).filter((n) => n.endsWith(".tmp"))).toEqual([]);
    expect(await writer.repairLatest("c1", () => undefined)).toBe("repaired");
    expect(await catalog.latest()).toBe("c1");
    await writer.settled();
  });

  it("orders ids that sort otherwise by publication, and never follows a link out of the root", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    // Outside the root: a directory shaped like a checkpoint, reached by an id-named link and a
    // trash-named link at the root, and by a link inside a checkpoint retention deletes.
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-pub-outside-"));
    try {
      await mkdir(join(outside, PARTICIPANTS_DIR, "model", "m1"), { recursive: true });
      await writeFile(join(outside, PARTICIPANTS_DIR, "model", "m1", "manifest.json"), "{}");
      await symlink(outside, join(root, "linked-partial"));
      await symlink(outside, join(root, ".trash-planted"));
      // Custom ids and a timestamp id, published in an order none of them sorts in.
      await publish(writer, "zeta", 100);
      await symlink(outside, join(root, "zeta", "elsewhere"));
      await publish(writer, "2026-01-01T00-00-00", 200);
      await publish(writer, "alpha", 300);
      expect(writer.retain("alpha")).toEqual(["zeta"]);
      await writer.settled();
      expect((await readdir(root)).sort()).toEqual(["2026-01-01T00-00-00", "LATEST", "alpha", "linked-partial"]);
      expect(catalog.scan().published.map((e) => e.checkpoint_id)).toEqual(["alpha", "2026-01-01T00-00-00"]);
      expect(await readFile(join(outside, PARTICIPANTS_DIR, "model", "m1", "manifest.json"), "utf8")).toBe("{}");
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });

  it("removes a deleted checkpoint's files in the background and sweeps temp files crashed writers left", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 1);
    await writeFile(join(root, ".LATEST.999.deadbeef.tmp"), "c0\n");
    // A crashed writer's: older than a staging under way can be (LEFTOVER_TEMP_AGE_MS).
    const longAgo = (Date.now() - LEFTOVER_TEMP_AGE_MS - 1000) / 1000;
    await utimes(join(root, ".LATEST.999.deadbeef.tmp"), longAgo, longAgo);
    await writeFile(join(root, ".results.999.cafe.tmp"), "a controller's own file\n");
    await publish(writer, "c1", 100);
    await publish(writer, "c2", 200);
    expect(writer.retain("c2")).toEqual(["c1"]);
    await writer.settled();
    expect((await readdir(root)).sort()).toEqual([".results.999.cafe.tmp", "LATEST", "c2"]);
  });

  it("stages LATEST ahead of publication without changing it, and discards an unpublished stage", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await publish(writer, "c1", 100);
    writer.stage("c2");
    writer.stage("c3");
    await publish(writer, "c2", 200);
    expect(await catalog.latest()).toBe("c2");
    const pending = (await readdir(root)).filter((n) => n.startsWith(".LATEST."));
    expect(pending).toHaveLength(1); // c3's staged temp, still reserved
    await writer.discard("c3");
    await writer.settled();
    expect((await readdir(root)).filter((n) => n.startsWith(".")).sort()).toEqual([]);
    expect(await catalog.latest()).toBe("c2");
  });

  it("references a controller state file with its sha256 and refuses a mismatch", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await mkdir(join(root, "c1"), { recursive: true });
    await writeFile(join(root, "c1", "trainer.json"), '{"step":7}');
    await expect(publish(writer, "c1", 1, { file: "trainer.json", sha256: "0".repeat(64) })).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    await expect(publish(writer, "c1", 1, { file: "missing.json" })).rejects.toMatchObject({ code: "not_found" });
    const ok = await publish(writer, "c1", 1, { file: "trainer.json" });
    expect(ok.manifest.controller_state).toEqual({ file: "trainer.json", sha256: sha256Hex('{"step":7}') });
    expect((await verifyCheckpoint(catalog, "c1")).records).toBe(2);
  });

  it("makes the controller state file durable before checkpoint.json references it", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    await mkdir(join(root, "c1"), { recursive: true });
    const state = join(root, "c1", "trainer.json");
    await writeFile(state, '{"step":7}'); // written as a controller would, without an fsync
    // Which files publication fsyncs through a file handle, by the path behind each descriptor.
    const probe = await open(state, "r");
    const proto = Object.getPrototypeOf(probe) as { sync: () => Promise<void> };
    await probe.close();
    const realSync = proto.sync;
    const synced: string[] = [];
    const spy = vi.spyOn(proto, "sync").mockImplementation(function (this: { fd: number }) {
      synced.push(readlinkSync(`/proc/self/fd/${this.fd}`));
      return realSync.call(this);
    });
    try {
      await publish(writer, "c1", 1, { file: "trainer.json" });
    } finally {
      spy.mockRestore();
    }
    expect(synced).toContain(state);
  });
});

describe("verify", () => {
  it("accepts an intact checkpoint and names invalid_checkpoint_state on any mismatch", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    await publish(writer, "c1", 1);
    const report = await verifyCheckpoint(catalog, "c1");
    expect(report).toMatchObject({ checkpoint_id: "c1", records: 2 });
    const dir = join(root, "c1", "gym", "model", "m1");
    const recordsFile = (await readdir(dir)).find((n) => n.startsWith("records-"))!;
    await writeFile(join(dir, recordsFile), '{"episode_id":{"rollout_id":"r1","attempt":0},"x":2}\n{"episode_id":{"rollout_id":"r2","attempt":1}}\n');
    await expect(verifyCheckpoint(catalog, "c1")).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("digest") });
    await expect(verifyCheckpoint(catalog, "nope")).rejects.toMatchObject({ code: "not_found" });
  });

  it("verifies records that span many read chunks", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const big = `{"episode_id":{"rollout_id":"r1","attempt":0},"state":"${"é".repeat(300_000)}"}`;
    const entries = [await writeParticipant(root, "c9", "model", "m1", [big, '{"episode_id":{"rollout_id":"r2","attempt":0}}'])];
    await writer.publish({ checkpointId: "c9", epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: entries, controllerState: null });
    expect(await verifyCheckpoint(catalog, "c9")).toMatchObject({ checkpoint_id: "c9", records: 2 });
  });

  it("detects a tampered manifest and a wrong count", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    await publish(writer, "c1", 1);
    const path = join(root, "c1", "gym", "agent", "a1", "manifest.json");
    const manifest = JSON.parse(await readFile(path, "utf8")) as Record<string, unknown>;
    manifest.record_count = 3;
    await writeFile(path, `${JSON.stringify(manifest, null, 2)}\n`);
    await expect(verifyCheckpoint(catalog, "c1")).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("manifest digest") });
  });
});
