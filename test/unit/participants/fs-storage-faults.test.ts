import type { FileHandle } from "node:fs/promises";
import { mkdir, mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { toCheckpointError } from "../../../protocol/index.js";
import { FsCheckpointStorage, participantDir } from "../../../participants/storage/fs-storage.js";
import { ScriptRecordSchema } from "../../../participants/testing/scriptable-kind.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import type { ParticipantTarget } from "../../../participants/storage/checkpoint-storage.js";
import { fsyncDir } from "../../../participants/storage/fs-durable.js";
import { refusalCode } from "../../support/refusal.js";

// Faults below the storage: the next fsyncDir of `fsync.dir` fails; the next link() fails; the
// next sync() of a temp records file fails.
const faults = vi.hoisted(() => ({
  fsyncDir: undefined as { dir: string; error: NodeJS.ErrnoException } | undefined,
  link: undefined as NodeJS.ErrnoException | undefined,
  recordsSync: undefined as NodeJS.ErrnoException | undefined,
  mkdir: undefined as { path: string; error: NodeJS.ErrnoException } | undefined,
}));
vi.mock("../../../participants/storage/fs-durable.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../participants/storage/fs-durable.js")>();
  return {
    ...original,
    fsyncDir: vi.fn(async (dir: string) => {
      const fault = faults.fsyncDir;
      if (fault && fault.dir === dir) {
        faults.fsyncDir = undefined;
        throw fault.error;
      }
      return original.fsyncDir(dir);
    }),
  };
});
vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const original = await importOriginal<typeof import("node:fs/promises")>();
  const link = async (...args: Parameters<typeof original.link>) => {
    const error = faults.link;
    if (error) {
      faults.link = undefined;
      throw error;
    }
    return original.link(...args);
  };
  const mkdir = async (...args: Parameters<typeof original.mkdir>) => {
    const fault = faults.mkdir;
    if (fault && String(args[0]) === fault.path) {
      faults.mkdir = undefined;
      throw fault.error;
    }
    return original.mkdir(...args);
  };
  const open = async (...args: Parameters<typeof original.open>): Promise<FileHandle> => {
    const handle = await original.open(...args);
    const error = faults.recordsSync;
    if (!error || !String(args[0]).includes("/.records.jsonl.")) return handle;
    faults.recordsSync = undefined;
    return handleWith(handle, { sync: () => Promise.reject(error) });
  };
  return withOverrides(original, { link, mkdir, open });
});

const eio = (syscall: string) => Object.assign(new Error(`EIO: i/o error, ${syscall}`), { errno: -5, code: "EIO", syscall });

let root: string;
let target: ParticipantTarget;
const storage = new FsCheckpointStorage();
const records = [
  { episode_id: { rollout_id: "r1", attempt: 0 }, state: { n: 1 } },
  { episode_id: { rollout_id: "r2", attempt: 0 }, state: null },
];
const write = (gate = new WriteGate()) => storage.write(target, records, { gate, createdAt: 1, extra: {} });

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-fs-faults-"));
  target = { checkpointDir: join(root, "c1"), checkpointId: "c1", kind: "agent", instance: "agent0" };
});
afterEach(async () => {
  faults.fsyncDir = undefined;
  faults.link = undefined;
  faults.recordsSync = undefined;
  faults.mkdir = undefined;
  await rm(root, { recursive: true, force: true });
});

describe("filesystem checkpoint storage under faults", () => {
  it("a directory fsync that fails after mkdir (EIO) is storage_error, and the retry still fsyncs the entries that write created before it publishes", async () => {
    const fsynced = vi.mocked(fsyncDir);
    faults.fsyncDir = { dir: join(target.checkpointDir, "gym"), error: eio("fsync") };
    expect(toCheckpointError(await write().catch((error: unknown) => error)).code).toBe("storage_error");
    fsynced.mockClear();
    await write(); // the commit's retry: the directories exist by now
    const c1 = target.checkpointDir;
    // The entries the failed fsync (of gym, holding agent) and those after it would have made durable:
    // without them, a power loss after the publication can drop gym/agent/agent0 with the records.
    expect(fsynced.mock.calls.map(([dir]) => dir).sort()).toEqual([root, c1, join(c1, "gym"), participantDir(target)].sort());
  });

  it("a commit's mkdir that fails part way (EIO on gym/<kind>) is storage_error, and the retry fsyncs the entry the failed one created", async () => {
    const fsynced = vi.mocked(fsyncDir);
    const c1 = target.checkpointDir;
    await mkdir(c1);
    const commitWrite = () => storage.write(target, records, { gate: new WriteGate(), createdAt: 1, extra: {}, existingCheckpointDir: true });
    faults.mkdir = { path: join(c1, "gym", "agent"), error: Object.assign(eio("mkdir"), { path: join(c1, "gym", "agent") }) };
    // The mkdir's own failure (EIO), not an ENOENT of the next component that swallowing it would give.
    const failed = toCheckpointError(await commitWrite().catch((error: unknown) => error));
    expect([failed.code, failed.message]).toEqual(["storage_error", expect.stringContaining("EIO")]);
    fsynced.mockClear();
    await commitWrite();
    // gym was created by the failed attempt: its entry in c1 must be made durable too.
    expect(fsynced.mock.calls.map(([dir]) => dir).sort()).toEqual([c1, join(c1, "gym"), join(c1, "gym", "agent"), participantDir(target)].sort());
  });

  it("a records fsync that fails (EIO) is storage_error and leaves nothing; the retry publishes", async () => {
    faults.recordsSync = eio("fsync");
    expect(toCheckpointError(await write().catch((error: unknown) => error)).code).toBe("storage_error");
    expect(await readdir(participantDir(target))).toEqual([]);
    const written = await write();
    expect((await readdir(participantDir(target))).sort()).toEqual(["manifest.json", written.manifest.records_file]);
  });

  it("a manifest link that fails (EIO) is storage_error with no manifest, nothing a restore accepts; the retry publishes", async () => {
    faults.link = eio("link");
    expect(toCheckpointError(await write().catch((error: unknown) => error)).code).toBe("storage_error");
    expect((await readdir(participantDir(target))).filter((f) => f.startsWith("."))).toEqual([]);
    expect(await refusalCode(storage.read(target, ScriptRecordSchema))).toBe("invalid_checkpoint_state");
    await write();
    expect((await storage.read(target, ScriptRecordSchema)).records).toEqual(records);
  });

  it("a gate stopped while records are serialized publishes nothing and leaves no temp file", async () => {
    let checks = 0;
    const gate = new WriteGate();
    const original = gate.throwIfStopped.bind(gate);
    gate.throwIfStopped = () => {
      if (++checks === 2) void gate.stop();
      original();
    };
    expect(await refusalCode(write(gate))).toBe("stale_checkpoint");
    expect(await readdir(participantDir(target))).toEqual([]);
  });
});
