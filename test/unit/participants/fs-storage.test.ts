import { execFileSync } from "node:child_process";
import { readdirSync } from "node:fs";
import type { FileHandle } from "node:fs/promises";
import { mkdir, mkdtemp, readdir, readFile, rm, symlink, truncate, writeFile, unlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { MAX_MANIFEST_BYTES, parentsOfCreated, sha256Hex, toCheckpointError } from "../../../protocol/index.js";
import { FsCheckpointStorage, participantDir } from "../../../participants/storage/fs-storage.js";
import { ScriptRecordSchema } from "../../../participants/testing/scriptable-kind.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import type { ParticipantTarget } from "../../../participants/storage/checkpoint-storage.js";
import { fsyncDir } from "../../../participants/storage/fs-durable.js";
import { readParticipantManifest, scanRecordLines } from "../../../participants/storage/fs-storage.js";
import { refusalCode, refusalOf as refusal } from "../../support/refusal.js";

// Records which directories the storage fsyncs (they are still fsynced).
vi.mock("../../../participants/storage/fs-durable.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../participants/storage/fs-durable.js")>();
  return { ...original, fsyncDir: vi.fn(original.fsyncDir) };
});

// Fault injection below the storage: the next write into a temp manifest fails as a full disk does;
// the next open of a path ending in `openFailure.suffix` fails with its error (the storage refusing a read);
// the next temp records file fills the disk: its first write writes half (as write(2) does on the
// last free blocks, without an error) and every later one fails with `recordsDiskFull`.
const faults = vi.hoisted(() => ({
  manifestWrite: undefined as NodeJS.ErrnoException | undefined,
  recordsDiskFull: undefined as NodeJS.ErrnoException | undefined,
  openFailure: undefined as { suffix: string; error: NodeJS.ErrnoException } | undefined,
}));
vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const original = await importOriginal<typeof import("node:fs/promises")>();
  const open = async (...args: Parameters<typeof original.open>): Promise<FileHandle> => {
    const failure = faults.openFailure;
    if (failure && String(args[0]).endsWith(failure.suffix)) {
      faults.openFailure = undefined;
      throw failure.error;
    }
    const handle = await original.open(...args);
    const full = faults.recordsDiskFull;
    if (full && String(args[0]).includes("/.records.jsonl.")) {
      faults.recordsDiskFull = undefined;
      let writes = 0;
      return handleWith(handle, { write: (buffer: Buffer) => (writes++ === 0 ? handle.write(buffer, 0, Math.floor(buffer.byteLength / 2)) : Promise.reject(full)) });
    }
    const error = faults.manifestWrite;
    if (!error || !String(args[0]).includes("/.manifest.json.")) return handle;
    faults.manifestWrite = undefined;
    return handleWith(handle, { writeFile: () => Promise.reject(error) });
  };
  return withOverrides(original, { open });
});

let root: string;
let target: ParticipantTarget;
const storage = new FsCheckpointStorage();
const records = [
  { episode_id: { rollout_id: "r1", attempt: 0 }, state: { text: "héllo ✓", n: 1 } },
  { episode_id: { rollout_id: "r2", attempt: 3 }, state: null },
];

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-fs-"));
  target = { checkpointDir: join(root, "c1"), checkpointId: "c1", kind: "agent", instance: "agent0" };
});
afterEach(() => rm(root, { recursive: true, force: true }));

const write = (gate = new WriteGate(), recs = records) => storage.write(target, recs, { gate, createdAt: 1, extra: {} });

const code = refusalCode;

describe("filesystem checkpoint storage", () => {
  it("names the records file by the sha256 of its bytes and round-trips exactly", async () => {
    const written = await write();
    const dir = participantDir(target);
    const bytes = await readFile(join(dir, written.manifest.records_file));
    expect(sha256Hex(bytes)).toBe(written.manifest.records_sha256);
    expect(written.manifest.records_file).toBe(`records-${written.manifest.records_sha256}.jsonl`);
    expect(written.bytes).toBe(bytes.byteLength);
    expect(written.manifestSha256).toBe(sha256Hex(await readFile(join(dir, "manifest.json"))));
    const read = await storage.read(target, ScriptRecordSchema);
    expect(read.records).toEqual(records);
    expect((await readdir(dir)).sort()).toEqual(["manifest.json", written.manifest.records_file]);
  });

  it("filters while still checking digest and count over the whole file", async () => {
    await write();
    const read = await storage.read(target, ScriptRecordSchema, (r) => r.episode_id.rollout_id === "r2");
    expect(read.records.map((r) => r.episode_id.rollout_id)).toEqual(["r2"]);
  });

  // A re-publication compares with the manifest already there; a read of it the storage refuses
  // (EIO) is that failure (storage_error), not "different content" (checkpoint_conflict, which
  // would also remove our records file).
  it("a re-publication whose read of the existing manifest fails (EIO) is storage_error, not a conflict", async () => {
    const first = await write();
    const path = join(participantDir(target), "manifest.json");
    faults.openFailure = { suffix: "/manifest.json", error: Object.assign(new Error(`EIO: i/o error, open '${path}'`), { errno: -5, code: "EIO", syscall: "open", path }) };
    expect(toCheckpointError(await write().catch((error: unknown) => error)).code).toBe("storage_error");
    expect((await readdir(participantDir(target))).sort()).toEqual(["manifest.json", first.manifest.records_file]);
  });

  // Every file a write opens is closed (the temp manifest's handle included), whatever the outcome.
  it("leaves no file descriptor open: ten writes, published or refused, hold none after them", async () => {
    const open = () => readdirSync("/proc/self/fd").length;
    await write(); // warm-up: whatever the first write loads stays open (module files, none of ours)
    const before = open();
    for (let i = 0; i < 5; i++) await write();
    for (let i = 0; i < 5; i++) await code(write(new WriteGate(), records.slice(0, 1)));
    expect(open()).toBe(before);
  });

  it("re-publishes identical content idempotently and refuses different content", async () => {
    const first = await write();
    const again = await write();
    expect(again.manifestSha256).toBe(first.manifestSha256);
    expect(await code(write(new WriteGate(), records.slice(0, 1)))).toBe("checkpoint_conflict");
    // The refused write removed its own records file (reference §4.1 step 8), not the published one.
    expect((await readdir(participantDir(target))).sort()).toEqual(["manifest.json", first.manifest.records_file]);
    // Same records, other manifest content (extra): the records file is the published one's, kept.
    expect(await code(storage.write(target, records, { gate: new WriteGate(), createdAt: 1, extra: { other: true } }))).toBe("checkpoint_conflict");
    const read = await storage.read(target, ScriptRecordSchema);
    expect(read.records).toHaveLength(2);
  });

  // Reference §4.1 step 6: the manifest is create-only, so of two writers racing into one
  // participant directory exactly one publishes; the other is refused and leaves no records file.
  it("of two writers racing with different records, exactly one publishes and the loser leaves nothing behind", async () => {
    for (let round = 0; round < 20; round++) {
      target = { ...target, checkpointDir: join(root, `race${round}`), checkpointId: `race${round}` };
      await mkdir(target.checkpointDir);
      const outcomes = await Promise.allSettled([write(new WriteGate(), records), write(new WriteGate(), records.slice(0, 1))]);
      const won = outcomes.filter((o): o is PromiseFulfilledResult<Awaited<ReturnType<typeof write>>> => o.status === "fulfilled");
      expect(won).toHaveLength(1);
      const lost = outcomes.find((o) => o.status === "rejected");
      expect(toCheckpointError(lost!.reason).code).toBe("checkpoint_conflict");
      expect((await readdir(participantDir(target))).sort()).toEqual([won[0]!.value.manifest.records_file, "manifest.json"].sort());
      const read = await storage.read(target, ScriptRecordSchema);
      expect(read.manifestSha256).toBe(won[0]!.value.manifestSha256);
      expect(read.records).toHaveLength(won[0]!.value.manifest.record_count);
    }
  });

  it("refuses a manifest larger than every reader accepts (an adapter's manifestExtra past 1 MiB) before publishing anything: payload_too_large, not a commit no restore can read", async () => {
    const huge = { owners: "x".repeat(MAX_MANIFEST_BYTES) };
    const refused = await refusal(storage.write(target, records, { gate: new WriteGate(), createdAt: 1, extra: huge }));
    expect(refused).toMatchObject({ code: "payload_too_large", message: expect.stringContaining(`over the ${MAX_MANIFEST_BYTES}-byte limit`) });
    expect(await readdir(participantDir(target))).toEqual([]); // no manifest, no records file, no temp file
    // What fits is committed and read back as before.
    const written = await storage.write(target, records, { gate: new WriteGate(), createdAt: 1, extra: { owners: "x".repeat(1000) } });
    expect((await storage.read(target, ScriptRecordSchema)).manifest).toEqual(written.manifest);
  });

  it("refuses a record whose line no reader can decode (UTF-8 bytes past the longest string) before publishing anything: payload_too_large naming the record, not a checkpoint every restore refuses", async () => {
    // Readers decode each line as one string, and Node bounds that by the line's UTF-8 bytes: a
    // record of 2^28 CJK characters is a string V8 holds and JSON.stringify makes, but its 768 MiB
    // line is refused by every restore and verify. Shown with a small limit: the same rule.
    const cjk = { episode_id: { rollout_id: "r3", attempt: 1 }, state: { text: "\u4e00".repeat(100) } }; // 100 characters, 300 bytes
    const line = Buffer.byteLength(`${JSON.stringify(cjk)}\n`);
    // As many bytes as the line has characters: it fits in characters, not in bytes.
    const limit = JSON.stringify(cjk).length + 1;
    expect(line).toBe(limit + 200);
    const small = new FsCheckpointStorage({ maxRecordLineBytes: limit });
    const refused = await refusal(small.write(target, [...records, cjk], { gate: new WriteGate(), createdAt: 1, extra: {} }));
    expect(refused).toMatchObject({ code: "payload_too_large", message: expect.stringContaining(`record 2 (r3-a1) is ${line} bytes as a JSON line`) });
    expect(refused.message).toContain(`over the ${limit}-byte limit`);
    expect(await readdir(participantDir(target))).toEqual([]); // no manifest, no records file, no temp file
    // The same limit on the read side: a line the writer accepts is one the reader decodes.
    const fits = new FsCheckpointStorage({ maxRecordLineBytes: line });
    await fits.write(target, [...records, cjk], { gate: new WriteGate(), createdAt: 1, extra: {} });
    expect((await fits.read(target, ScriptRecordSchema)).records).toEqual([...records, cjk]);
  });

  it("a record JSON.stringify cannot make into one string (V8's RangeError) is payload_too_large too, not internal_error", async () => {
    const tooLong = { episode_id: { rollout_id: "r4", attempt: 0 }, state: null, toJSON: () => { throw new RangeError("Invalid string length"); } };
    const refused = await refusal(storage.write(target, [...records, tooLong], { gate: new WriteGate(), createdAt: 1, extra: {} }));
    expect(refused).toMatchObject({ code: "payload_too_large", message: expect.stringContaining("record 2 (r4)") });
    expect(await readdir(participantDir(target))).toEqual([]);
  });

  it("a manifest write that fails (a full disk, ENOSPC) is storage_error naming the file, leaves no temp manifest behind; the retry publishes a clean directory", async () => {
    // A real one: writing to /dev/full fails with ENOSPC, for root too.
    faults.manifestWrite = await writeFile("/dev/full", "x").then(() => undefined, (error: NodeJS.ErrnoException) => error);
    const refused = toCheckpointError(await write().catch((error: unknown) => error));
    expect(refused.code).toBe("storage_error");
    expect(refused.message).toMatch(new RegExp(`^ENOSPC: no space left on device, write '${participantDir(target)}/\\.manifest\\.json\\.[^']+'$`));
    const written = await write(); // space freed: the commit's retry
    expect((await storage.read(target, ScriptRecordSchema)).records).toEqual(records);
    // Only what the layout names: no dot-named leftovers.
    expect((await readdir(participantDir(target))).sort()).toEqual(["manifest.json", written.manifest.records_file]);
  });

  it("a records file the disk fills up part way (a short write, then ENOSPC) is storage_error, not a commit of a short file; the retry publishes a clean directory", async () => {
    faults.recordsDiskFull = await writeFile("/dev/full", "x").then(() => undefined, (error: NodeJS.ErrnoException) => error);
    const refused = toCheckpointError(await write().catch((error: unknown) => error));
    expect(refused.code).toBe("storage_error");
    expect(refused.message).toMatch(/^ENOSPC: no space left on device/);
    await expect(readdir(participantDir(target))).resolves.toEqual([]);
    const written = await write(); // space freed: the commit's retry
    expect((await storage.read(target, ScriptRecordSchema)).records).toEqual(records);
    expect((await readdir(participantDir(target))).sort()).toEqual(["manifest.json", written.manifest.records_file]);
  });

  it("refuses an existing manifest whose bytes differ from ours even when they decode to the same text", async () => {
    const extra = { note: "\uFFFD" }; // a replacement character a session name carried, say
    const first = await storage.write(target, records, { gate: new WriteGate(), createdAt: 1, extra });
    const manifest = join(participantDir(target), "manifest.json");
    const bytes = await readFile(manifest);
    expect(sha256Hex(bytes)).toBe(first.manifestSha256);
    // Damage: the character's three bytes replaced by one invalid byte, which decodes to U+FFFD again.
    const at = bytes.indexOf(Buffer.from("\uFFFD", "utf8"));
    await writeFile(manifest, Buffer.concat([bytes.subarray(0, at), Buffer.from([0xff]), bytes.subarray(at + 3)]));
    // An idempotent re-commit would reply a manifest_sha256 the file on disk does not have.
    expect(await code(storage.write(target, records, { gate: new WriteGate(), createdAt: 1, extra }))).toBe("checkpoint_conflict");
  });

  it("refuses an existing manifest of another size without reading it (a huge one included)", async () => {
    await mkdir(participantDir(target), { recursive: true });
    const manifest = join(participantDir(target), "manifest.json");
    await writeFile(manifest, "");
    await truncate(manifest, 3 * 2 ** 30); // sparse: readFile would fail with ERR_FS_FILE_TOO_LARGE
    expect(await code(write())).toBe("checkpoint_conflict");
  });

  it("fsyncs the parent of every directory it creates, so the participant's entry survives a power loss", async () => {
    const fsynced = vi.mocked(fsyncDir);
    fsynced.mockClear();
    await write();
    const c1 = target.checkpointDir;
    expect(fsynced.mock.calls.map(([dir]) => dir).sort()).toEqual([root, c1, join(c1, "gym"), join(c1, "gym", "agent"), participantDir(target)].sort());
    // Only what it created: a second instance of the kind adds its own entry under gym/agent.
    fsynced.mockClear();
    target = { ...target, instance: "agent1" };
    await write();
    expect(fsynced.mock.calls.map(([dir]) => dir).sort()).toEqual([join(c1, "gym", "agent"), participantDir(target)].sort());
  });

  it("parentsOfCreated: the directories holding each entry mkdir -p created (also used by writeFileAtomic)", () => {
    expect(parentsOfCreated("/a/b/c/d", "/a/b/c")).toEqual(["/a/b/c", "/a/b"]);
    expect(parentsOfCreated("/a/b/c/d", "/a/b/c/d")).toEqual(["/a/b/c"]);
    expect(parentsOfCreated("/a/b/c/d", undefined)).toEqual([]);
  });

  it("publishes nothing once the gate is stopped", async () => {
    const gate = new WriteGate();
    await gate.stop();
    expect(await code(write(gate))).toBe("stale_checkpoint");
    expect(await readdir(participantDir(target))).toEqual([]);
  });

  describe("refuses corrupt checkpoints with invalid_checkpoint_state", () => {
    it("corrupted record bytes", async () => {
      const written = await write();
      const file = join(participantDir(target), written.manifest.records_file);
      const text = await readFile(file, "utf8");
      await writeFile(file, text.replace("héllo", "hallo"));
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
    });

    it("a wrong count", async () => {
      await write();
      const path = join(participantDir(target), "manifest.json");
      const manifest = JSON.parse(await readFile(path, "utf8"));
      await writeFile(path, JSON.stringify({ ...manifest, record_count: 3 }));
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
    });

    it("a truncated manifest", async () => {
      await write();
      const path = join(participantDir(target), "manifest.json");
      const text = await readFile(path, "utf8");
      await writeFile(path, text.slice(0, text.length / 2));
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
    });

    it("a missing manifest or records file", async () => {
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
      const written = await write();
      await unlink(join(participantDir(target), written.manifest.records_file));
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
    });

    it("a manifest of another instance or checkpoint, or with unknown fields", async () => {
      await write();
      expect(await code(storage.read({ ...target, checkpointId: "c2" }, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
      const path = join(participantDir(target), "manifest.json");
      const manifest = JSON.parse(await readFile(path, "utf8"));
      await writeFile(path, JSON.stringify({ ...manifest, instance: "agent1" }));
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
      await writeFile(path, JSON.stringify({ ...manifest, unexpected: 1 }));
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
      await writeFile(path, JSON.stringify({ ...manifest, records_file: "../../../etc/passwd" }));
      expect(await code(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
    });

    it("a manifest or records file that is a FIFO or a device, refused at once instead of blocking the restore", { timeout: 5000 }, async () => {
      const written = await write();
      const dir = participantDir(target);
      const records = join(dir, written.manifest.records_file);
      await unlink(records);
      execFileSync("mkfifo", [records]);
      expect(await refusal(storage.read(target, ScriptRecordSchema))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });
      await unlink(join(dir, "manifest.json"));
      execFileSync("mkfifo", [join(dir, "manifest.json")]);
      expect(await refusal(readParticipantManifest(dir))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });
      await unlink(join(dir, "manifest.json"));
      await symlink("/dev/zero", join(dir, "manifest.json"));
      expect(await refusal(readParticipantManifest(dir))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("symbolic link") });
    });

    it("a manifest or records file that is a symbolic link, even to a valid checkpoint's file (it could point out of the checkpoint root)", async () => {
      const written = await write();
      const dir = participantDir(target);
      const elsewhere = join(root, "elsewhere");
      await mkdir(elsewhere);
      for (const name of ["manifest.json", written.manifest.records_file]) {
        await writeFile(join(elsewhere, name), await readFile(join(dir, name)));
        await unlink(join(dir, name));
        await symlink(join(elsewhere, name), join(dir, name));
        expect(await refusal(storage.read(target, ScriptRecordSchema))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("symbolic link") });
        await unlink(join(dir, name));
        await writeFile(join(dir, name), await readFile(join(elsewhere, name)));
      }
      expect((await storage.read(target, ScriptRecordSchema)).records).toEqual(records);
    });

    it("but a read the storage refuses (EIO, EACCES: not the checkpoint's fault) is passed on as the system error, storage_error; a missing file stays invalid_checkpoint_state", async () => {
      const written = await write();
      const dir = participantDir(target);
      const systemError = (code: string, path: string) => Object.assign(new Error(`${code}: i/o error, open '${path}'`), { errno: -5, code, syscall: "open", path });
      for (const name of ["manifest.json", written.manifest.records_file]) {
        for (const errno of ["EIO", "EACCES"]) {
          faults.openFailure = { suffix: `/${name}`, error: systemError(errno, join(dir, name)) };
          const refused = toCheckpointError(await storage.read(target, ScriptRecordSchema).catch((error: unknown) => error));
          expect([name, refused.code, refused.message]).toEqual([name, "storage_error", `${errno}: i/o error, open '${join(dir, name)}'`]);
        }
        faults.openFailure = { suffix: `/${name}`, error: systemError("ENOENT", join(dir, name)) };
        expect([name, await code(storage.read(target, ScriptRecordSchema))]).toEqual([name, "invalid_checkpoint_state"]);
      }
      expect((await storage.read(target, ScriptRecordSchema)).records).toEqual(records);
    });

    it("records that break the kind's schema", async () => {
      await write();
      const strict = ScriptRecordSchema.extend({ state: ScriptRecordSchema.shape.state.refine((s) => s === null) });
      expect(await code(storage.read(target, strict))).toBe("invalid_checkpoint_state");
    });
  });
});

describe("scanRecordLines", () => {
  it("splits records that span many read chunks (multi-byte text included) and hashes the exact bytes", async () => {
    const big = `{"x":"${"é".repeat(400_000)}"}`; // ~800 KB: a dozen 64 KiB chunks, a 2-byte char split across some
    const text = `{"a":1}\n${big}\n\n{"b":2}`; // an empty line and a final line without a newline
    const file = join(root, "records.jsonl");
    await writeFile(file, text);
    const lines: string[] = [];
    const scanned = await scanRecordLines(file, (line) => lines.push(line));
    expect(lines).toEqual(['{"a":1}', big, "", '{"b":2}']);
    expect(scanned).toEqual({ bytes: Buffer.byteLength(text), count: 4, digest: sha256Hex(text) });
  });

  it("refuses a line that grows past what any record can be before it ends (damage that is one endless line is not held whole)", async () => {
    const file = join(root, "records.jsonl");
    await writeFile(file, `{"a":1}\n${"x".repeat(1 << 20)}`); // 1 MiB without a newline, refused past 64 KiB
    const lines: string[] = [];
    const refused = await refusal(scanRecordLines(file, (line) => lines.push(line), 64 << 10));
    expect(refused).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("line 2 is longer than any record can be") });
    expect(lines).toEqual(['{"a":1}']);
  });

  it("a final line that cannot be handled is invalid_checkpoint_state, like any other line", async () => {
    const file = join(root, "records.jsonl");
    await writeFile(file, '{"a":1}\n{"b":2}');
    // What a line too long for a string throws (RangeError), without writing 512 MiB.
    const failing = (line: string) => {
      if (line === '{"b":2}') throw new RangeError("Cannot create a string longer than 0x1fffffe8 characters");
    };
    expect(await code(scanRecordLines(file, failing))).toBe("invalid_checkpoint_state");
  });
});
