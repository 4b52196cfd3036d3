import { readdir, rm, truncate, writeFile, readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hookLog, startWorld, type World } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";

// A restore of a checkpoint whose files are damaged installs nothing anywhere: the coordinator
// finds the damage before it sends a restore, so no participant installs attempt+1 (which the
// clean-up would then retire, fencing it) and nobody is parked.

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  await (await world.startCoordinator()).whenReady();
});
afterAll(async () => {
  await world?.close();
});

const episode = (r: string) => ({ rollout_id: r, attempt: 0 });

async function checkpointThenRestart(id: string, rollout: string): Promise<string> {
  for (const instance of ["env1", "policy", "agent1", "tools"]) world.participant(instance).adapter.addEpisode(episode(rollout), { n: 1 });
  await world.client.checkpoint({ checkpoint_id: id });
  await world.stopParticipants();
  await world.startParticipants();
  hookLog.length = 0;
  return join(world.root, id, "gym", "agent", "agent1");
}

async function recordsFile(participantDir: string): Promise<string> {
  const name = (await readdir(participantDir)).find((f) => f.startsWith("records-"));
  if (!name) throw new Error("no records file");
  return join(participantDir, name);
}

async function expectNothingInstalled(id: string, rollout: string): Promise<void> {
  const error = await refusalOf(world.client.restore({ checkpoint_id: id, episode_ids: [episode(rollout)] }));
  expect(error.code === "invalid_checkpoint_state" || error.code === "restore_failed").toBe(true);
  expect(error.message).toContain("agent/agent1");
  for (const p of world.participants) {
    expect(p.adapter.hooks()).not.toContain("install");
    expect(p.adapter.restored.size).toBe(0);
    expect(p.handle.controlPlane.currentPhase).toBe("idle");
    expect(p.handle.controlPlane.isRetired({ rollout_id: rollout, attempt: 1 })).toBe(false);
  }
  expect(hookLog.filter((h) => h.startsWith("retire:"))).toEqual([]);
}

describe("restore of a checkpoint with one participant's files damaged", () => {
  it("records digest mismatch (a byte changed): nothing installed anywhere, nothing retired", async () => {
    const dir = await checkpointThenRestart("dmg-digest", "d1");
    const file = await recordsFile(dir);
    const text = await readFile(file, "utf8");
    await writeFile(file, text.replace('"n":1', '"n":2'));
    await expectNothingInstalled("dmg-digest", "d1");
  });

  it("records file missing: nothing installed anywhere, nothing retired", async () => {
    const dir = await checkpointThenRestart("dmg-missing", "d2");
    await rm(await recordsFile(dir));
    await expectNothingInstalled("dmg-missing", "d2");
  });

  it("records file truncated: nothing installed anywhere, nothing retired", async () => {
    const dir = await checkpointThenRestart("dmg-trunc-records", "d3");
    await truncate(await recordsFile(dir), 5);
    await expectNothingInstalled("dmg-trunc-records", "d3");
  });

  it("manifest truncated: nothing installed anywhere, nothing retired", async () => {
    const dir = await checkpointThenRestart("dmg-manifest", "d4");
    await truncate(join(dir, "manifest.json"), 10);
    await expectNothingInstalled("dmg-manifest", "d4");
  });

  // Records then manifest (reference §4.1, §13: upstream has no test of this window): a records
  // file whose manifest was never created is no participant checkpoint, whatever it holds.
  it("manifest missing beside whole records (a crash between the records rename and the manifest): nothing installed anywhere, nothing retired", async () => {
    const dir = await checkpointThenRestart("dmg-no-manifest", "d5");
    await rm(join(dir, "manifest.json"));
    await expectNothingInstalled("dmg-no-manifest", "d5");
  });
});
