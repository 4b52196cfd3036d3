import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, expect, it, vi } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GLOBAL_MANIFEST_FILE, MANIFEST_SCHEMA_VERSION } from "../../../protocol/index.js";

/**
 * scan() runs after every publication, for every `list` and at recovery, blocking: with its cache
 * warm it is a readdir and a stat per checkpoint. Dropping the cache entries of checkpoints gone
 * from the root looked each one up in the directory listing (an array): N² comparisons, a second
 * of event loop at 20,000 checkpoints under the root, three at 40,000.
 */
const N = 2000;
let root: string | undefined;
afterEach(() => {
  vi.restoreAllMocks();
  if (root) rmSync(root, { recursive: true, force: true });
});

it("a warm scan of N checkpoints compares O(N) names, and still forgets the removed ones", () => {
  root = mkdtempSync(join(tmpdir(), "gym-ckpt-catalog-"));
  for (let i = 0; i < N; i++) {
    const id = `ckpt-${String(i).padStart(5, "0")}`;
    mkdirSync(join(root, id));
    const manifest = { schema_version: MANIFEST_SCHEMA_VERSION, checkpoint_id: id, epoch: 1, prepared_at: i, published_at: i, stop: false, scope: null, restarts: [], participants: [], controller_state: null };
    writeFileSync(join(root, id, GLOBAL_MANIFEST_FILE), JSON.stringify(manifest));
  }
  const catalog = new CheckpointCatalog(root);
  expect(catalog.scan().published).toHaveLength(N);
  rmSync(join(root, "ckpt-00000"), { recursive: true });

  // Elements looked through by Array#includes during the warm scan.
  let compared = 0;
  const includes = Array.prototype.includes;
  vi.spyOn(Array.prototype, "includes").mockImplementation(function (this: unknown[], ...args: Parameters<typeof includes>) {
    compared += this.length;
    return includes.apply(this, args);
  });
  const { published } = catalog.scan();
  vi.restoreAllMocks();

  expect(compared).toBeLessThanOrEqual(10 * N);
  expect(published).toHaveLength(N - 1);
  expect((catalog as unknown as { entries: Map<string, unknown> }).entries.has("ckpt-00000")).toBe(false);
});
