import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { encodeControllerReply } from "../../../coordinator/api/reply-budget.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { catalogListing } from "../../../coordinator/publication/catalog-listing.js";
import { CtlListReplySchema, MAX_CHECKPOINT_ID_CHARS } from "../../../protocol/index.js";

/**
 * Retention never deletes a damaged checkpoint, and `list` names each one: over NATS, enough of them
 * made every list `reply_too_large`. The reply keeps the first ones (by id) that fit and counts the
 * rest (`damaged_left_out`); the HTTP API and `gym-ckpt ls --json` still list them all. Measured
 * against a NATS server's max_payload of 64 KiB (the same path as 1 MiB), so a few hundred small
 * files are enough.
 */
describe("list over NATS with more damaged checkpoints than one message holds", () => {
  let root: string;
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  it("keeps the damaged entries that fit, in id order, says how many were left out, and keeps every checkpoint", async () => {
    root = mkdtempSync(join(tmpdir(), "gym-ckpt-damaged-"));
    const count = 600;
    const budget = 64 * 1024;
    const ids = Array.from({ length: count }, (_, n) => `d${String(n).padStart(MAX_CHECKPOINT_ID_CHARS - 1, "0")}`);
    for (const id of ids) {
      mkdirSync(join(root, id));
      writeFileSync(join(root, id, "checkpoint.json"), "{not json");
    }
    const listing = await catalogListing(new CheckpointCatalog(root));
    expect(listing.damaged).toHaveLength(count);
    expect(Buffer.byteLength(JSON.stringify(listing))).toBeGreaterThan(budget);

    const text = encodeControllerReply("list", listing, budget);
    expect(Buffer.byteLength(text)).toBeLessThanOrEqual(budget);
    const reply = CtlListReplySchema.parse(JSON.parse(text));
    const kept = reply.damaged!.length;
    expect(kept).toBeGreaterThan(100);
    expect(kept).toBeLessThan(count);
    expect(reply.damaged!.map((d) => d.checkpoint_id)).toEqual(ids.slice(0, kept));
    expect(reply.damaged_left_out).toBe(count - kept);
    expect(reply.checkpoints).toEqual(listing.checkpoints);
    // As little left out as it can: one more entry would not have fit.
    expect(Buffer.byteLength(text) + Buffer.byteLength(JSON.stringify(reply.damaged![0])) + 1).toBeGreaterThan(budget);
    // The engine's listing (also the HTTP API's) is left whole.
    expect(listing.damaged).toHaveLength(count);
    expect(listing).not.toHaveProperty("damaged_left_out");
  });
});
