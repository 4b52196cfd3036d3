import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ManualClock, ParticipantControlPlane, ScriptableKind } from "../../../participants/index.js";
import { refusalOf } from "../../support/refusal.js";

// The storage refusing a path lookup below the checkpoint root: the next lstat or realpath of a
// path ending in `fault.suffix` fails with `fault.error` (tests run as root, so permissions cannot).
const fault = vi.hoisted(() => ({ suffix: undefined as string | undefined, error: undefined as NodeJS.ErrnoException | undefined }));
vi.mock("node:fs/promises", async (importOriginal) => {
  const original = await importOriginal<typeof import("node:fs/promises")>();
  const faulty =
    <A extends unknown[], R>(call: (path: string, ...rest: A) => Promise<R>) =>
    async (path: string, ...rest: A): Promise<R> => {
      if (fault.suffix !== undefined && String(path).endsWith(fault.suffix)) throw fault.error;
      return call(path, ...rest);
    };
  return { ...original, lstat: faulty(original.lstat as never), realpath: faulty(original.realpath as never) };
});

const T0 = 1_700_000_000;
let root: string;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cp-dir-"));
  plane = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env0", clock: new ManualClock(T0 * 1000), leaseGraceSeconds: 60, checkpointRoot: root });
});

afterEach(async () => {
  fault.suffix = undefined;
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

const systemError = (code: string, syscall: string, path: string) => Object.assign(new Error(`${code}: refused, ${syscall} '${path}'`), { code, syscall, path });

describe("checkpoint_dir lookups the storage refuses", () => {
  it.each([
    ["EIO", "lstat", "/gym"],
    ["EACCES", "realpath", ""],
  ])("a %s from %s is storage_error (the storage, not the request), and nothing changes", async (code, syscall, below) => {
    const dir = join(root, "c1");
    await mkdir(join(dir, "gym"), { recursive: true });
    fault.suffix = syscall === "realpath" ? root : `c1${below}`;
    fault.error = systemError(code, syscall, fault.suffix);
    const refusal = await refusalOf(plane.handle("restore", { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1, checkpoint_dir: dir, episode_ids: [] } as never));
    expect(refusal).toMatchObject({ code: "storage_error", message: expect.stringContaining(code) });
    expect(plane.currentPhase).toBe("idle");
  });

  it("a symbolic link loop in checkpoint_dir is the request's directory: invalid_request", async () => {
    const dir = join(root, "c1");
    await mkdir(join(dir, "gym"), { recursive: true });
    fault.suffix = "c1/gym";
    fault.error = systemError("ELOOP", "lstat", fault.suffix);
    expect((await refusalOf(plane.handle("restore", { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1, checkpoint_dir: dir, episode_ids: [] } as never))).code).toBe("invalid_request");
  });
});
