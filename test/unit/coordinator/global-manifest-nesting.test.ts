import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { MANIFEST_SCHEMA_VERSION } from "../../../protocol/index.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-nesting-"));
});
afterEach(() => rm(root, { recursive: true, force: true }));

const nested = (depth: number): unknown => JSON.parse(`${"[".repeat(depth)}${"]".repeat(depth)}`);

async function publish(id: string, inline: unknown): Promise<void> {
  await mkdir(join(root, id, "gym"), { recursive: true });
  const manifest = { schema_version: MANIFEST_SCHEMA_VERSION, checkpoint_id: id, epoch: 1, prepared_at: 1, published_at: 2, stop: false, scope: null, restarts: [], participants: [], controller_state: { inline } };
  // Written as the text a hand edit or a bad copy leaves: JSON.stringify itself cannot nest this deep.
  const text = JSON.stringify(manifest).replace('"inline":"DEEP"', `"inline":${inline === "DEEP" ? `${"[".repeat(10_000)}${"]".repeat(10_000)}` : JSON.stringify(inline)}`);
  await writeFile(join(root, id, "checkpoint.json"), text);
}

describe("checkpoint.json nested deeper than any reply can carry", () => {
  it("is invalid_checkpoint_state for get and verify (it parsed and verified, then a reply's JSON.stringify overflowed the stack)", async () => {
    await publish("deep", "DEEP");
    const catalog = new CheckpointCatalog(root);
    await expect(catalog.get("deep")).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("nests more than 1024 levels deep") });
    await expect(verifyCheckpoint(catalog, "deep")).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
  });

  it("reads one within the limit as before", async () => {
    await publish("fine", nested(100));
    const manifest = await new CheckpointCatalog(root).get("fine");
    expect(JSON.stringify(manifest.controller_state)).toBe(`{"inline":${"[".repeat(100)}${"]".repeat(100)}}`);
  });
});
