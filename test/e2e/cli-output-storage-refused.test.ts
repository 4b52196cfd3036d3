import { spawnSync } from "node:child_process";
import { closeSync, existsSync, openSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../coordinator/publication/global-manifest-writer.js";
import { writeParticipant } from "../unit/coordinator/fake-participants.js";
import { MAIN, ensureBuilt } from "./coordinator-process.js";

/**
 * Output the storage refuses (`gym-ckpt ls > listing.txt` on a full disk: /dev/full answers every
 * write ENOSPC) is the catalog's storage_error, one line on stderr and exit 1, not an uncaught
 * exception's stack trace. A reader that went away (EPIPE) is another case: closed-output.ts.
 */
let root: string;
beforeAll(async () => {
  ensureBuilt();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-out-full-"));
  const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
  const entry = await writeParticipant(root, "c1", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
  await writer.publish({ checkpointId: "c1", epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
  await writer.settled();
});
afterAll(async () => {
  if (root) await rm(root, { recursive: true, force: true });
});

describe.skipIf(!existsSync("/dev/full"))("gym-ckpt output to a full disk", () => {
  it("ls, ls --json and verify print one storage_error line on stderr and exit 1, no stack trace", () => {
    for (const args of [["ls"], ["ls", "--json"], ["verify", "c1"], ["verify", "LATEST", "--json"]]) {
      const full = openSync("/dev/full", "w");
      try {
        const run = spawnSync(process.execPath, [MAIN, ...args, "--root", root], { stdio: ["ignore", full, "pipe"], encoding: "utf8", timeout: 30_000 });
        expect({ args, status: run.status, signal: run.signal, stderr: run.stderr }).toEqual({
          args,
          status: 1,
          signal: null,
          stderr: expect.stringMatching(/^error storage_error: ENOSPC[^\n]*standard output[^\n]*\n$/),
        });
      } finally {
        closeSync(full);
      }
    }
  });
});
