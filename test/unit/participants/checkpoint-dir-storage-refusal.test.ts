import { mkdir, mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { refusalOf } from "../../support/refusal.js";

// The storage refusing a path lookup below the checkpoint root: the next lstat or realpath of a
// path ending in `fault.suffix` fails with `fault.error` (tests run as root, so permissions cannot).
const fault = vi.hoisted(() => ({ suffix: undefined as string | undefined, error: undefined as NodeJS.ErrnoException | undefined }));
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const original = await importOriginal<typeof import("node:fs/promises")>();
  const faulty =
    <A extends unknown[], R>(call: (path: string, ...rest: A) => Promise<R>) =>
    async (path: string, ...rest: A): Promise<R> => {
      if (fault.suffix !== undefined && String(path).endsWith(fault.suffix)) throw fault.error;
      return call(path, ...rest);
    };
  return withOverrides(original, { lstat: faulty(original.lstat as never), realpath: faulty(original.realpath as never) });
});

const T0 = 1_700_000_000;
let root: string;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cp-dir-"));
  kind = new ScriptableKind("environment");
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock: new ManualClock(T0 * 1000), leaseGraceSeconds: 60, checkpointRoot: root });
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

// A coordinator (or its successor) re-drives an op this participant already answered while the
// storage hiccups: the kept reply answers it; only an op not answered yet is refused.
describe("checkpoint_dir lookups the storage refuses, on a retry of an answered op", () => {
  const faults = [
    ["EIO", "lstat"],
    ["ESTALE", "realpath"],
  ] as const;
  const inject = (code: string, syscall: string) => {
    fault.suffix = syscall === "realpath" ? root : "/gym";
    fault.error = systemError(code, syscall, fault.suffix);
  };
  const commitOf = (id: string) => ({ checkpoint_id: id, deadline_ts: T0 + 30, epoch: 1, checkpoint_dir: join(root, id), episode_ids: null, stop: false });

  it.each(faults)("a retried commit gets its kept reply under a %s from %s (also after its resume); a commit not answered yet is storage_error and changes nothing", async (code, syscall) => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await plane.handle("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1 });
    await mkdir(join(root, "c1"));
    const first = await plane.handle("commit", commitOf("c1"));
    expect(first.phase).toBe("committed");
    inject(code, syscall);
    expect(await plane.handle("commit", commitOf("c1"))).toEqual(first);
    await plane.handle("resume", { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1 } as never);
    expect(await plane.handle("commit", commitOf("c1"))).toEqual(first);

    await plane.handle("prepare", { checkpoint_id: "c2", deadline_ts: T0 + 30, epoch: 1 });
    await mkdir(join(root, "c2"));
    const lease = plane.status().lease_expires_at;
    const refusal = await refusalOf(plane.handle("commit", { ...commitOf("c2"), deadline_ts: T0 + 40 }));
    expect({ code: refusal.code, detail: refusal.message.includes(code) }).toEqual({ code: "storage_error", detail: true });
    expect({ phase: plane.currentPhase, lease: plane.status().lease_expires_at, files: await readdir(join(root, "c2")) }).toEqual({ phase: "prepared", lease, files: [] });
    // Nothing kept for it: once the storage answers, the same commit goes ahead.
    fault.suffix = undefined;
    expect((await plane.handle("commit", commitOf("c2"))).phase).toBe("committed");
  });

  it.each(faults)("a retried restore gets its kept reply under a %s from %s, installing nothing again", async (code, syscall) => {
    const source = new ScriptableKind("environment");
    const writer = new ParticipantControlPlane({ adapter: source, instance: "env0", clock: new ManualClock(T0 * 1000), checkpointRoot: root });
    source.addEpisode({ rollout_id: "r1", attempt: 0 });
    await writer.handle("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1 });
    await mkdir(join(root, "c1"));
    await writer.handle("commit", commitOf("c1"));
    writer.dispose();

    const restore = { checkpoint_id: "c1", deadline_ts: T0 + 30, epoch: 1, checkpoint_dir: join(root, "c1"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] };
    const first = await plane.handle("restore", restore);
    expect(first.restored).toEqual(["r1-a1"]);
    inject(code, syscall);
    expect(await plane.handle("restore", restore)).toEqual(first);
    expect(kind.hooks().filter((hook) => hook === "install")).toHaveLength(1);
  });
});
