import { cp, mkdir, mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { canonicalDigest, type ParticipantEntry } from "../../../protocol/index.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { checkCommittedRecords, committedEpisodeIds, readCommittedManifest } from "../../../coordinator/publication/committed-records.js";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { refusalOf } from "../../support/refusal.js";
import { writeParticipant } from "./fake-participants.js";

let root: string;
let catalog: CheckpointCatalog;
let writer: GlobalManifestWriter;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-verify-"));
  catalog = new CheckpointCatalog(root);
  writer = new GlobalManifestWriter(catalog, 5);
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

async function publish(id: string, participants: ParticipantEntry[], stateFile: string | null = null): Promise<void> {
  await writer.publish({ checkpointId: id, epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants, controllerState: stateFile === null ? null : { file: stateFile } });
  await writer.settled();
}

const line = (rollout: string) => `{"episode_id":{"rollout_id":"${rollout}","attempt":0}}`;

describe("verifyCheckpoint's report and refusals", () => {
  // The report's totals are what the records files hold: records counted, bytes summed from 0.
  it("reports each participant's records and bytes and their sums", async () => {
    const a = await writeParticipant(root, "c1", "agent", "a1", [line("r1"), line("r2")]);
    const e = await writeParticipant(root, "c1", "environment", "e1", [line("r3")]);
    await publish("c1", [a, e]);
    const size = async (p: ParticipantEntry) => (await stat(join(root, "c1", "gym", p.kind, p.instance, `records-${p.records_sha256}.jsonl`))).size;
    const [aBytes, eBytes] = [await size(a), await size(e)];
    const report = await verifyCheckpoint(catalog, "c1");
    expect(report).toEqual({
      checkpoint_id: "c1",
      participants: [
        { kind: "agent", instance: "a1", records: 2, bytes: aBytes },
        { kind: "environment", instance: "e1", records: 1, bytes: eBytes },
      ],
      records: 3,
      bytes: aBytes + eBytes,
      unreferenced: [],
    });
  });

  // A checkpoint nobody took part in has no gym/ directory: nothing is missing from it.
  it("verifies a checkpoint without participants and without a gym/ directory", async () => {
    await mkdir(join(root, "c0")); // the engine creates the checkpoint directory at prepare
    await publish("c0", []);
    expect(await verifyCheckpoint(catalog, "c0")).toEqual({ checkpoint_id: "c0", participants: [], records: 0, bytes: 0, unreferenced: [] });
  });

  // Only a missing gym/ of a checkpoint listing nobody is fine: a gym/ that cannot be listed (here a
  // file) is refused naming it, whether or not anybody is listed.
  it("refuses a gym/ that is no directory, naming it", async () => {
    await mkdir(join(root, "c0")); // the engine creates the checkpoint directory at prepare
    await publish("c0", []);
    await writeFile(join(root, "c0", "gym"), "not a directory");
    expect(await refusalOf(verifyCheckpoint(catalog, "c0"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("gym cannot be listed") });
  });

  // A controller state file that is gone is reported as missing, not as a digest mismatch.
  it("refuses a missing controller state file as missing", async () => {
    const a = await writeParticipant(root, "c1", "agent", "a1", [line("r1")]);
    await writeFile(join(root, "c1", "state.json"), "{}");
    await publish("c1", [a], "state.json");
    await rm(join(root, "c1", "state.json"));
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("state.json is missing") });
  });
});

describe("a participant manifest copied into another instance's directory", () => {
  // The manifest must name the entry's kind AND instance: one of the same kind but another
  // instance (a copied directory) is not that participant's commit.
  it("is refused as belonging to the instance it names", async () => {
    const a1 = await writeParticipant(root, "c1", "agent", "a1", [line("r1")]);
    await cp(join(root, "c1", "gym", "agent", "a1"), join(root, "c1", "gym", "agent", "a2"), { recursive: true });
    const a2 = { ...a1, instance: "a2", manifest_path: "gym/agent/a2/manifest.json" };
    expect(await refusalOf(readCommittedManifest(join(root, "c1"), "c1", a2))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("manifest belongs to agent/a1") });
  });
});

describe("the restore's records pre-check and the episode list read back for a reply without one", () => {
  const lines = [line("r2"), line("r1"), line("r1")];

  // checkCommittedRecords counts records by newlines without parsing them: a whole file passes.
  it("checkCommittedRecords passes a committed participant whose file ends with its newline", async () => {
    const a = await writeParticipant(root, "c1", "agent", "a1", lines);
    expect((await checkCommittedRecords(join(root, "c1"), "c1", a)).record_count).toBe(3);
  });

  // committedEpisodeIds: the sorted unique capture keys, accepted when they match the reply's
  // episode_count and episode_ids_sha256, refused when either differs.
  it("committedEpisodeIds returns the keys matching the reply's count and digest, and refuses a mismatch", async () => {
    const a = await writeParticipant(root, "c1", "agent", "a1", lines);
    const dir = join(root, "c1");
    const ids = await committedEpisodeIds(dir, "c1", a); // nothing to match: the keys as read
    expect(ids).toHaveLength(2);
    expect(ids).toEqual([...ids].sort());
    expect(await committedEpisodeIds(dir, "c1", { ...a, episode_count: 2, episode_ids_sha256: canonicalDigest(ids) })).toEqual(ids);
    expect(await refusalOf(committedEpisodeIds(dir, "c1", { ...a, episode_count: 3 }))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("the commit reply says 3") });
    expect(await refusalOf(committedEpisodeIds(dir, "c1", { ...a, episode_ids_sha256: canonicalDigest(ids.slice(1)) }))).toMatchObject({ code: "invalid_checkpoint_state" });
  });
});

describe("files in the participants' tree that no manifest names", () => {
  // A restore reads only what the manifests name (pinned by digest): such files change nothing it
  // installs, so they are reported (a crashed writer's leftovers take disk; anything else is worth
  // a look), never refused. A participant directory checkpoint.json does not list stays refused.
  it("are reported with what they look like, the checkpoint still verified; the controller's files outside gym/ are not", async () => {
    const a = await writeParticipant(root, "c1", "agent", "a1", [line("r1")]);
    await publish("c1", [a]);
    const dir = join(root, "c1");
    const a1 = join(dir, "gym", "agent", "a1");
    await writeFile(join(a1, ".records.jsonl.4242.0a1b2c3d4e5f"), "left by a crashed writer");
    await writeFile(join(a1, ".manifest.json.4242.0a1b2c3d4e5f"), "{}");
    await writeFile(join(a1, `records-${"0".repeat(64)}.jsonl`), `${line("r9")}\n`);
    await writeFile(join(a1, "notes.txt"), "?");
    await mkdir(join(a1, "extra"));
    await writeFile(join(dir, "gym", ".DS_Store"), "");
    await writeFile(join(dir, ".checkpoint.json.4242.0a1b2c3d4e5f.tmp"), "{}");
    await writeFile(join(dir, "optimizer.pt"), "the controller's own file");
    const report = await verifyCheckpoint(catalog, "c1");
    expect(report.records).toBe(1);
    expect(report.unreferenced).toEqual([
      { path: ".checkpoint.json.4242.0a1b2c3d4e5f.tmp", kind: "temp" },
      { path: "gym/.DS_Store", kind: "other" },
      { path: "gym/agent/a1/.manifest.json.4242.0a1b2c3d4e5f", kind: "temp" },
      { path: "gym/agent/a1/.records.jsonl.4242.0a1b2c3d4e5f", kind: "temp" },
      { path: "gym/agent/a1/extra", kind: "other" },
      { path: "gym/agent/a1/notes.txt", kind: "other" },
      { path: `gym/agent/a1/records-${"0".repeat(64)}.jsonl`, kind: "records" },
    ]);
    await mkdir(join(dir, "gym", "agent", "a2"));
    expect(await refusalOf(verifyCheckpoint(catalog, "c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("gym/agent/a2 holds a participant's files that checkpoint.json does not list") });
  });
});
