import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { GLOBAL_MANIFEST_FILE, MANIFEST_SCHEMA_VERSION, RecordBaseSchema, sha256Hex, type ParticipantEntry } from "../../../protocol/index.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { exportCheckpointSeeds } from "../../../participants/replay/index.js";
import { refusalOf } from "../../support/refusal.js";
import { writeParticipant } from "../coordinator/fake-participants.js";

/**
 * A checkpoint.json or manifest.json of another format version (a newer gym-ckpt's, with fields this
 * build does not know) is refused by every reader (`get`/`ls`, `verify`, a participant's restore,
 * `seeds`) as invalid_checkpoint_state naming both versions: not a list of unrecognized keys that
 * reads like damage, and never read as this version's.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-versions-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

const NEWER = MANIFEST_SCHEMA_VERSION + 1;
const LINE = '{"episode_id":{"rollout_id":"r1","attempt":0}}';

async function published(id: string): Promise<{ catalog: CheckpointCatalog; entry: ParticipantEntry }> {
  const catalog = new CheckpointCatalog(root);
  const writer = new GlobalManifestWriter(catalog, 5);
  const entry = await writeParticipant(root, id, "agent", "a1", [LINE]);
  await writer.publish({ checkpointId: id, epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
  await writer.settled();
  return { catalog, entry };
}

/** Rewrites a JSON file as a newer format would: another schema_version and a field this build lacks. */
async function asNewerFormat(path: string): Promise<string> {
  const value = JSON.parse(await readFile(path, "utf8")) as Record<string, unknown>;
  const text = `${JSON.stringify({ ...value, schema_version: NEWER, added_later: true }, null, 2)}\n`;
  await writeFile(path, text);
  return text;
}

const namesVersions = expect.stringMatching(new RegExp(`schema_version ${NEWER}\\b.*\\b${MANIFEST_SCHEMA_VERSION}\\b`));

describe("a checkpoint.json of a newer format", () => {
  it("is refused by get, ls (damaged) and verify, naming both versions", async () => {
    const { catalog } = await published("c1");
    await asNewerFormat(join(root, "c1", GLOBAL_MANIFEST_FILE));
    const fresh = new CheckpointCatalog(root);
    const refusal = await refusalOf(fresh.get("c1"));
    expect(refusal).toMatchObject({ code: "invalid_checkpoint_state", message: namesVersions });
    expect(refusal.message).not.toContain("Unrecognized");
    expect(fresh.scan().damaged).toEqual([{ checkpoint_id: "c1", code: "invalid_checkpoint_state", detail: namesVersions }]);
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: namesVersions });
  });

  it("is refused by seeds, naming both versions", async () => {
    await published("c1");
    await asNewerFormat(join(root, "c1", GLOBAL_MANIFEST_FILE));
    const error = await exportCheckpointSeeds(join(root, "c1")).then(
      () => undefined,
      (e: unknown) => e as Error & { code?: string },
    );
    expect(error?.message).toEqual(namesVersions);
    expect(error?.message).not.toContain("Unrecognized");
  });
});

describe("a participant manifest.json of a newer format", () => {
  it("is refused by verify and by a participant's restore read, naming both versions", async () => {
    // checkpoint.json pins the newer manifest's bytes: only its version is wrong for this build.
    const entry = await writeParticipant(root, "c1", "agent", "a1", [LINE]);
    const manifestPath = join(root, "c1", entry.manifest_path);
    const text = await asNewerFormat(manifestPath);
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 5);
    await writer.publish({ checkpointId: "c1", epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [{ ...entry, manifest_sha256: sha256Hex(text) }], controllerState: null });
    await writer.settled();
    const verified = await refusalOf(verifyCheckpoint(catalog, "c1"));
    expect(verified).toMatchObject({ code: "invalid_checkpoint_state", message: namesVersions });
    expect(verified.message).not.toContain("Unrecognized");

    const storage = new FsCheckpointStorage();
    const restored = await refusalOf(storage.read({ checkpointDir: join(root, "c1"), kind: "agent", instance: "a1", checkpointId: "c1" }, RecordBaseSchema));
    expect(restored).toMatchObject({ code: "invalid_checkpoint_state", message: namesVersions });
    expect(restored.message).not.toContain("Unrecognized");
  });
});
