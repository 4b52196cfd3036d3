import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, expect, it, vi } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GLOBAL_MANIFEST_FILE, MANIFEST_SCHEMA_VERSION } from "../../../protocol/index.js";

/**
 * scan() runs blocking after every publication (retention), for every `list` (up to three times)
 * and at recovery. A valid checkpoint.json is parsed once and then known by its stat; a damaged one
 * (here: a field this build does not know, as a newer build of the same schema version may write,
 * with a large scope) was read and parsed again by every scan: 3-5 s of event loop per scan for a
 * 30 MB file, longer than the default 5 s leader lease.
 */
let root: string | undefined;
afterEach(() => {
  vi.restoreAllMocks();
  if (root) rmSync(root, { recursive: true, force: true });
});

const manifest = (id: string, extra: Record<string, unknown> = {}) => ({
  schema_version: MANIFEST_SCHEMA_VERSION,
  checkpoint_id: id,
  epoch: 1,
  prepared_at: 1,
  published_at: 2,
  stop: false,
  scope: Array.from({ length: 1000 }, (_, i) => ({ rollout_id: `r${i}`, attempt: 0 })),
  restarts: [],
  participants: [],
  controller_state: null,
  ...extra,
});

it("a damaged checkpoint.json is parsed once, not by every scan, until the file changes", () => {
  root = mkdtempSync(join(tmpdir(), "gym-ckpt-catalog-damaged-"));
  mkdirSync(join(root, "c1"));
  const path = join(root, "c1", GLOBAL_MANIFEST_FILE);
  const damaged = JSON.stringify(manifest("c1", { written_by_a_newer_build: true }));
  writeFileSync(path, damaged);
  const catalog = new CheckpointCatalog(root);
  const first = catalog.scan().damaged;
  expect(first).toEqual([{ checkpoint_id: "c1", code: "invalid_checkpoint_state", detail: expect.stringContaining("written_by_a_newer_build") }]);

  // Parses of that file's text by the next scans.
  const parse = JSON.parse;
  let parsed = 0;
  vi.spyOn(JSON, "parse").mockImplementation((text: string, reviver?: Parameters<typeof parse>[1]) => {
    if (text === damaged) parsed++;
    return parse(text, reviver) as unknown;
  });
  for (let i = 0; i < 3; i++) expect(catalog.scan().damaged).toEqual(first);
  expect(parsed).toBe(0);

  // Repaired (a new file in its place): read again and listed.
  vi.restoreAllMocks();
  rmSync(path);
  writeFileSync(path, JSON.stringify(manifest("c1")));
  const { published, damaged: none } = catalog.scan();
  expect(published.map((e) => e.checkpoint_id)).toEqual(["c1"]);
  expect(none).toEqual([]);
});
