import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CoordinatorConfigSchema } from "../../../coordinator/config/coordinator-config.js";
import { startCoordinator } from "../../../coordinator/daemon/coordinator-daemon.js";
import { fsyncDirectory } from "../../../coordinator/publication/durable-fs.js";

// Records which directories are fsynced (they still are).
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  return { ...original, fsyncDirectory: vi.fn(original.fsyncDirectory) };
});

let base: string;
beforeEach(async () => {
  base = await mkdtemp(join(tmpdir(), "gym-ckpt-root-made-"));
  vi.mocked(fsyncDirectory).mockClear();
});
afterEach(async () => {
  await rm(base, { recursive: true, force: true });
});

describe("a checkpoint root the coordinator creates at start", () => {
  // Every checkpoint's durability (its directory's entry, LATEST's rename: each fsynced in the root)
  // rests on the root's own entry in its parent: unsynced, a power loss can take the root and all of
  // them, as collect's records dir would without its parents' fsync.
  it("is made durable: the directories holding what mkdir -p created are fsynced", async () => {
    const root = join(base, "a", "b", "ckpt");
    const config = CoordinatorConfigSchema.parse({ token: "t", checkpoint_root: root, http: { enabled: false } });
    // No NATS: the start fails after the root's steps, which run before it connects.
    await expect(startCoordinator({ config, nc: {} as NatsConnection, logger: pino({ level: "silent" }) })).rejects.toThrow();
    const fsynced = vi.mocked(fsyncDirectory).mock.calls.map(([dir]) => dir);
    expect(fsynced).toEqual(expect.arrayContaining([join(base, "a", "b"), join(base, "a"), base]));
  });
});
