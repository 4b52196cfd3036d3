import { execFileSync } from "node:child_process";
import { cp, mkdir, mkdtemp, readFile, rename, rm, symlink, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { MAX_CONTROLLER_STATE_FILE_BYTES, MAX_GLOBAL_MANIFEST_BYTES, MAX_MANIFEST_BYTES, sha256Hex, type ParticipantEntry } from "../../../protocol/index.js";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { scanRecords } from "../../../coordinator/publication/committed-records.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { readRegularFile, readRegularFileSync } from "../../../coordinator/publication/regular-file.js";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { refusalOf } from "../../support/refusal.js";
import { writeParticipant } from "./fake-participants.js";

/**
 * Files in the checkpoint root are read as regular files within a size limit: a FIFO (which a
 * plain read would block on forever, with the engine lock or the event loop held), a device, an
 * oversized file or, for the controller state, a symbolic link is `invalid_checkpoint_state`.
 */
let root: string;
let outside: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-files-"));
  outside = await mkdtemp(join(tmpdir(), "gym-ckpt-outside-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
  await rm(outside, { recursive: true, force: true });
});

const mkfifo = (path: string) => execFileSync("mkfifo", [path]);
/** A sparse file: its size is what fstat reports, nothing is written. */
const sparse = async (path: string, size: number) => {
  await writeFile(path, "");
  await truncate(path, size);
};

function publishInput(id: string, participants: ParticipantEntry[], file: string | null) {
  return {
    checkpointId: id,
    epoch: 1,
    preparedAt: 1,
    publishedAt: 2,
    stop: false,
    scope: null,
    restarts: [],
    participants,
    controllerState: file === null ? null : { file },
  };
}

describe("bounded regular-file reads", () => {
  it("refuse a FIFO at once, an oversized file, and a symbolic link when told not to follow it", async () => {
    const fifo = join(root, "fifo");
    mkfifo(fifo);
    expect(await refusalOf(readRegularFile(fifo, { maxBytes: 10 }))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });
    expect(() => readRegularFileSync(fifo, { maxBytes: 10 })).toThrow(/not a regular file/);
    await writeFile(join(root, "big"), "x".repeat(11));
    expect((await refusalOf(readRegularFile(join(root, "big"), { maxBytes: 10 }))).message).toContain("over the 10-byte limit");
    await writeFile(join(outside, "state.json"), "{}");
    await symlink(join(outside, "state.json"), join(root, "link"));
    expect(await readRegularFile(join(root, "link"), { maxBytes: 10 })).toBe("{}");
    expect((await refusalOf(readRegularFile(join(root, "link"), { maxBytes: 10, noFollow: true }))).message).toContain("is a symbolic link");
    expect(await readRegularFile(join(root, "big"), { maxBytes: 11 })).toBe("x".repeat(11));
  });
});

describe("the catalog", () => {
  it("refuses a LATEST or checkpoint.json that is a FIFO instead of blocking on it", { timeout: 5000 }, async () => {
    const catalog = new CheckpointCatalog(root);
    mkfifo(join(root, "LATEST"));
    expect((await refusalOf(catalog.latest())).code).toBe("invalid_checkpoint_state");
    await mkdir(join(root, "c1"));
    mkfifo(join(root, "c1", "checkpoint.json"));
    expect((await refusalOf(catalog.get("c1"))).code).toBe("invalid_checkpoint_state");
    // The blocking scan (retention, list) neither lists it nor takes it for a partial checkpoint: damaged.
    expect(catalog.scan()).toEqual({ published: [], partial: [], damaged: [{ checkpoint_id: "c1", code: "invalid_checkpoint_state", detail: expect.any(String) }] });
  });
});

describe("publication", () => {
  it("refuses a controller state file that is a FIFO, a symbolic link out of the checkpoint or too large, and publishes nothing", { timeout: 5000 }, async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    const entry = await writeParticipant(root, "c1", "agent", "a1", []);
    mkfifo(join(root, "c1", "fifo.json"));
    const fifo = await refusalOf(writer.publish(publishInput("c1", [entry], "fifo.json")));
    expect(fifo).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });

    await writeFile(join(outside, "secret.json"), "{}");
    await symlink(join(outside, "secret.json"), join(root, "c1", "link.json"));
    const link = await refusalOf(writer.publish(publishInput("c1", [entry], "link.json")));
    expect(link).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("symbolic link") });

    await sparse(join(root, "c1", "huge.json"), MAX_CONTROLLER_STATE_FILE_BYTES + 1);
    const huge = await refusalOf(writer.publish(publishInput("c1", [entry], "huge.json")));
    expect(huge).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining(`${MAX_CONTROLLER_STATE_FILE_BYTES}-byte limit`) });

    expect(catalog.has("c1")).toBe(false);
    expect(await catalog.latest()).toBeNull();
    // A missing file is still not_found; a regular one publishes.
    expect((await refusalOf(writer.publish(publishInput("c1", [entry], "missing.json")))).code).toBe("not_found");
    await writeFile(join(root, "c1", "state.json"), "{}");
    await writer.publish(publishInput("c1", [entry], "state.json"));
    expect(await catalog.latest()).toBe("c1");
    await writer.settled();
  });
});

describe("publication of a checkpoint.json past its readers' limit", () => {
  it("is refused (payload_too_large) before anything is written: LATEST never names a checkpoint nobody can read", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    await writer.publish(publishInput("c1", [await writeParticipant(root, "c1", "agent", "a1", [])], null));
    // Commit replies are bounded one by one (1 MiB), not their sum over every participant.
    const entry = await writeParticipant(root, "c2", "agent", "a1", []);
    const refused = await refusalOf(writer.publish(publishInput("c2", [{ ...entry, extras: { blob: "x".repeat(MAX_GLOBAL_MANIFEST_BYTES) } }], null)));
    expect(refused).toMatchObject({ code: "payload_too_large" });
    expect(await catalog.latest()).toBe("c1");
    expect(catalog.has("c2")).toBe(false);
    await writer.settled();
  });

  it("refuses payload_too_large, not internal_error, when the participants' entries together are longer than any string (hundreds of 1 MiB commit replies)", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    await writer.publish(publishInput("c1", [await writeParticipant(root, "c1", "agent", "a1", [])], null));
    const entry = await writeParticipant(root, "c2", "agent", "a1", []);
    // What JSON.stringify throws past the longest string, without building 512 MiB.
    const tooLong = { toJSON: () => { throw new RangeError("Invalid string length"); } };
    const refused = await refusalOf(writer.publish(publishInput("c2", [{ ...entry, extras: { blob: tooLong } }], null)));
    expect(refused).toMatchObject({ code: "payload_too_large", message: expect.stringContaining("longer than the longest string") });
    expect(await catalog.latest()).toBe("c1");
    expect(catalog.has("c2")).toBe(false);
    await writer.settled();
  });
});

describe("verify", () => {
  it("refuses an oversized or FIFO participant manifest, a FIFO records file and a linked controller state", { timeout: 5000 }, async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const entry = await writeParticipant(root, "c1", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    await writeFile(join(root, "c1", "state.json"), "{}");
    await writer.publish(publishInput("c1", [entry], "state.json"));
    await writer.settled();
    expect((await verifyCheckpoint(catalog, "c1")).records).toBe(1);
    const participantDir = join(root, "c1", "gym", "agent", "a1");

    const records = join(participantDir, `records-${entry.records_sha256}.jsonl`);
    await rm(records);
    mkfifo(records);
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });

    await rm(join(participantDir, "manifest.json"));
    mkfifo(join(participantDir, "manifest.json"));
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });

    await rm(join(participantDir, "manifest.json"));
    await sparse(join(participantDir, "manifest.json"), MAX_MANIFEST_BYTES + 1);
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining(`${MAX_MANIFEST_BYTES}-byte limit`) });

    const clean = await writeParticipant(root, "c2", "agent", "a1", []);
    await writeFile(join(outside, "state.json"), "{}");
    await writeFile(join(root, "c2", "state.json"), "{}");
    await writer.publish(publishInput("c2", [clean], "state.json"));
    await writer.settled();
    await rm(join(root, "c2", "state.json"));
    await symlink(join(outside, "state.json"), join(root, "c2", "state.json"));
    expect(await refusalOf(verifyCheckpoint(catalog, "c2"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("symbolic link") });
  });

  it("refuses a participant manifest, records file or directory reached through a symbolic link, even with matching contents", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const entry = await writeParticipant(root, "c1", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    await writer.publish(publishInput("c1", [entry], null));
    await writer.settled();
    expect((await verifyCheckpoint(catalog, "c1")).records).toBe(1);
    const participantDir = join(root, "c1", "gym", "agent", "a1");
    const copy = join(outside, "a1");
    await cp(participantDir, copy, { recursive: true });
    const linkedVerify = () => refusalOf(verifyCheckpoint(catalog, "c1"));

    for (const name of ["manifest.json", `records-${entry.records_sha256}.jsonl`]) {
      await rename(join(participantDir, name), join(outside, "kept"));
      await symlink(join(copy, name), join(participantDir, name));
      expect(await linkedVerify()).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("symbolic link") });
      await rm(join(participantDir, name));
      await rename(join(outside, "kept"), join(participantDir, name));
      expect((await verifyCheckpoint(catalog, "c1")).records).toBe(1);
    }

    // The instance directory, then the kind directory, replaced by a link to an identical copy.
    await rename(participantDir, join(outside, "original"));
    await symlink(copy, participantDir);
    expect(await linkedVerify()).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("reached through a symbolic link") });
    await rm(participantDir);
    await mkdir(join(outside, "agent"));
    await rename(join(outside, "original"), join(outside, "agent", "a1"));
    await rm(join(root, "c1", "gym", "agent"), { recursive: true });
    await symlink(join(outside, "agent"), join(root, "c1", "gym", "agent"));
    expect(await linkedVerify()).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("reached through a symbolic link") });

    // The checkpoint directory itself a link (out of the root): not a checkpoint this root holds.
    await rm(join(root, "c1", "gym", "agent"));
    await rename(join(outside, "agent"), join(root, "c1", "gym", "agent"));
    await rename(join(root, "c1"), join(outside, "c1"));
    await symlink(join(outside, "c1"), join(root, "c1"));
    expect(catalog.scan().published).toEqual([]);
    expect(await linkedVerify()).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("is a symbolic link") });
    await rm(join(root, "c1"));
    await rename(join(outside, "c1"), join(root, "c1"));
    expect((await verifyCheckpoint(catalog, "c1")).records).toBe(1);

    // A checkpoint root reached through a link (a mount point) is fine.
    const linkedRoot = join(outside, "root-link");
    await symlink(root, linkedRoot);
    expect((await verifyCheckpoint(new CheckpointCatalog(linkedRoot), "c1")).records).toBe(1);
  });
});

describe("reading checkpoints back", () => {
  it("an id naming a stray file under the root is not_found, like a missing one", async () => {
    await writeFile(join(root, "c2"), "not a checkpoint\n");
    expect(await refusalOf(verifyCheckpoint(new CheckpointCatalog(root), "c2"))).toMatchObject({ code: "not_found" });
  });

  it("a final records line that cannot be handled is invalid_checkpoint_state, like any other line", async () => {
    const file = join(root, "records.jsonl");
    await writeFile(file, '{"episode_id":{"rollout_id":"r1","attempt":0}}\n{"episode_id":{"rollout_id":"r2","attempt":0}}');
    // What a line too long for a string throws (RangeError), without writing 512 MiB.
    const failing = (record: { episode_id: { rollout_id: string } }) => {
      if (record.episode_id.rollout_id === "r2") throw new RangeError("Invalid string length");
    };
    expect(await refusalOf(scanRecords(file, "agent/a1", failing))).toMatchObject({ code: "invalid_checkpoint_state" });
  });

  it("refuses a line that grows past what any record can be before it ends (damage that is one endless line is not held whole)", async () => {
    const file = join(root, "records.jsonl");
    await writeFile(file, `{"episode_id":{"rollout_id":"r1","attempt":0}}\n${"x".repeat(1 << 20)}`); // 1 MiB without a newline, refused past 64 Ki characters
    const seen: string[] = [];
    const refused = await refusalOf(scanRecords(file, "agent/a1", (record) => seen.push(record.episode_id.rollout_id), 64 << 10));
    expect(refused).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("agent/a1: line 2 is longer than any record can be") });
    expect(seen).toEqual(["r1"]);
  });
});

describe("verify checks checkpoint.json against the records", () => {
  it("refuses episode_ids that differ from the capture keys the records name", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const lines = ['{"episode_id":{"rollout_id":"r2","attempt":1}}', '{"episode_id":{"rollout_id":"r1","attempt":0}}', '{"episode_id":{"rollout_id":"r1","attempt":0},"part":2}'];
    const entry = await writeParticipant(root, "c1", "agent", "a1", lines);
    expect(entry.episode_ids).toEqual(["r1", "r2-a1"]); // as a commit reply lists them: sorted, unique
    for (const [id, episodeIds] of [["c2", []], ["c3", ["r1"]], ["c4", ["r2-a1", "r1"]], ["c5", ["r1", "r1", "r2-a1"]], ["c6", ["r1", "r2-a1", "r3"]]] as const) {
      const copy = await writeParticipant(root, id, "agent", "a1", lines);
      await writer.publish(publishInput(id, [{ ...copy, episode_ids: [...episodeIds] }], null));
      expect(await refusalOf(verifyCheckpoint(catalog, id))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("episode_ids") });
    }
    await writer.publish(publishInput("c1", [entry], null));
    expect((await verifyCheckpoint(catalog, "c1")).records).toBe(3);
    await writer.settled();
  });

  it("refuses a participant listed twice", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const entry = await writeParticipant(root, "c1", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    await writer.publish(publishInput("c1", [entry, entry], null));
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("listed twice") });
    await writer.settled();
  });

  it("refuses participants' files checkpoint.json does not list (an entry lost from it), and reports temp files without refusing", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const line = ['{"episode_id":{"rollout_id":"r1","attempt":0}}'];
    const agent = await writeParticipant(root, "c1", "agent", "a1", line);
    await writeParticipant(root, "c1", "model", "m1", line);
    await writeParticipant(root, "c1", "agent", "a2", line);
    await writer.publish(publishInput("c1", [agent], null));
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("gym/agent/a2") });
    await rm(join(root, "c1", "gym", "agent", "a2"), { recursive: true });
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("gym/model") });
    await rm(join(root, "c1", "gym", "model"), { recursive: true });
    await writeFile(join(root, "c1", "gym", "agent", "a1", ".records.jsonl.123.abc"), "left by a crashed writer");
    await writeFile(join(root, "c1", "notes.txt"), "the controller's own file");
    const report = await verifyCheckpoint(catalog, "c1");
    expect(report.participants).toHaveLength(1);
    // The controller's notes.txt, outside gym/, is not checked.
    expect(report.unreferenced).toEqual([{ path: "gym/agent/a1/.records.jsonl.123.abc", kind: "temp" }]);
    await writer.settled();
  });
});

describe("verify hashes the manifest's bytes", () => {
  it("refuses a manifest whose bytes differ from the committed ones even when they decode to the same text", async () => {
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    const entry = await writeParticipant(root, "c1", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    // A manifest whose extra holds U+FFFD (a replacement character a session name carried, say).
    const path = join(root, "c1", "gym", "agent", "a1", "manifest.json");
    const manifest = JSON.parse(await readFile(path, "utf8")) as Record<string, unknown>;
    const text = `${JSON.stringify({ ...manifest, extra: { note: "\uFFFD" } }, null, 2)}\n`;
    await writeFile(path, text);
    const committed = { ...entry, manifest_sha256: sha256Hex(text) };
    await writer.publish(publishInput("c1", [committed], null));
    await writer.settled();
    expect((await verifyCheckpoint(catalog, "c1")).records).toBe(1);
    // Damage: the character's three bytes replaced by one invalid byte, which UTF-8 decoding turns
    // back into U+FFFD. The file is not what checkpoint.json pins (a restore pinning it refuses it).
    const bytes = Buffer.from(text, "utf8");
    const at = bytes.indexOf(Buffer.from("\uFFFD", "utf8"));
    const damaged = Buffer.concat([bytes.subarray(0, at), Buffer.from([0xff]), bytes.subarray(at + 3)]);
    await writeFile(path, damaged);
    expect(sha256Hex(damaged)).not.toBe(committed.manifest_sha256);
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("manifest digest") });
  });
});

describe("the dispatch log", () => {
  it("is refused when it is a FIFO (its size is no limit: it is streamed, test/unit/collect/dispatch-log-size.test.ts)", { timeout: 5000 }, async () => {
    mkfifo(join(root, "dispatched.jsonl"));
    expect((await refusalOf(DispatchLog.read(join(root, "dispatched.jsonl")))).code).toBe("invalid_checkpoint_state");
    expect(await DispatchLog.read(join(root, "absent.jsonl"))).toBeUndefined();
  });
});
