import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { refusalOf } from "../../support/refusal.js";
import { makeEngine, writers } from "./fake-participants.js";

// The checkpoint root is one this process may not search (mode 2770, the coordinator's user not
// in its group): every stat under it fails EACCES. Root searches anything, so `statSync` is wrapped.
let unsearchable: string | undefined;
vi.mock("node:fs", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof import("node:fs")>();
  const statSync = ((path: string, options?: Parameters<typeof actual.statSync>[1]) => {
    if (unsearchable !== undefined && String(path).startsWith(`${unsearchable}/`)) {
      throw Object.assign(new Error(`EACCES: permission denied, stat '${path}'`), { code: "EACCES", syscall: "stat", path });
    }
    return actual.statSync(path, options);
  }) as typeof actual.statSync;
  return withOverrides(actual, { statSync });
});

let root: string;
beforeEach(async () => {
  unsearchable = undefined;
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-unsearchable-"));
});
afterEach(async () => {
  unsearchable = undefined;
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("prepare of a fresh id under a root the coordinator cannot search", () => {
  it("is storage_error naming the stat, not stale_checkpoint 'already published'; nothing sent or journaled", async () => {
    const { engine, fake, journal, clock } = makeEngine(root);
    unsearchable = root;
    const refusal = await refusalOf(engine.prepare({ checkpoint_id: "fresh-1", deadline_ts: clock.now() / 1000 + 60 }));
    expect(refusal).toMatchObject({ code: "storage_error" });
    expect(refusal.message).toContain("EACCES");
    expect(fake.calls).toEqual([]);
    expect([...journal.entries.keys()]).toEqual([]);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("control: once the root is searchable the same id prepares", async () => {
    const { engine, clock } = makeEngine(root);
    await expect(engine.prepare({ checkpoint_id: "fresh-1", deadline_ts: clock.now() / 1000 + 60 })).resolves.toMatchObject({ prepared: true });
  });
});
