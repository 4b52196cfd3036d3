import { existsSync } from "node:fs";
import { mkdir, readdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { MAX_MODEL_RECORD_ROWS, ModelKind } from "../../../participants/kinds/model/index.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { deliveredCall, ledgerRow, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture({ cuts: false });
});
afterEach(async () => {
  await f.close();
});

it("a commit whose episode has more delivered calls than a model record holds is refused payload_too_large, writing nothing", async () => {
  // A long-lived key's ledger, one row over the cap, as earlier processes left it on disk.
  const lines: string[] = [];
  for (let i = 0; i <= MAX_MODEL_RECORD_ROWS; i++) lines.push(JSON.stringify({ ...ledgerRow("long", `mc-${i}`), parent_call_id: i ? `mc-${i - 1}` : null }));
  await mkdir(join(f.dir, "ledger"), { recursive: true });
  await writeFile(join(f.dir, "ledger", "long.lineage.jsonl"), `${lines.join("\n")}\n`);
  await f.kind.close();
  f.kind = new ModelKind({ ledgerDir: join(f.dir, "ledger"), cutBackend: null });
  await deliveredCall(f.kind, "short");
  const root = join(f.dir, "checkpoints");
  await mkdir(root);
  const plane = new ParticipantControlPlane({ adapter: f.kind, instance: "model0", checkpointRoot: root });
  try {
    const request = { checkpoint_id: "c1", deadline_ts: Date.now() / 1000 + 60, epoch: 1 };
    await plane.handle("prepare", request);
    const commit = { ...request, checkpoint_dir: join(root, "c1"), stop: false };
    await mkdir(commit.checkpoint_dir); // as the coordinator does before it commits
    await expect(plane.handle("commit", { ...commit, episode_ids: [ep("short"), ep("long")] })).rejects.toMatchObject({
      code: "payload_too_large",
      message: expect.stringContaining(`long has ${MAX_MODEL_RECORD_ROWS + 1} delivered model calls`),
    });
    expect(existsSync(join(root, "c1")) ? await readdir(join(root, "c1"), { recursive: true }) : []).toEqual([]);
    // Nothing pinned: the same checkpoint commits once the episode is left out of the scope.
    const reply = (await plane.handle("commit", { ...commit, episode_ids: [ep("short")] })) as { episode_ids: string[] };
    expect(reply.episode_ids).toEqual(["short"]);
    await plane.handle("resume", request);
  } finally {
    plane.dispose();
  }
}, 60_000);
