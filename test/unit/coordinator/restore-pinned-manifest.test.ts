import { mkdtemp, readFile, rename, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { RestoreRequestSchema } from "../../../protocol/index.js";
import { journalEmptied, makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

// A manifest replaced after publication, even a self-consistent one naming the same records, was
// never committed: the coordinator checks it against checkpoint.json, as verify does, and pins the
// digest checkpoint.json records in each participant's restore message (a manifest replaced after
// the check is refused by its participant: test/integration/restore-manifest-pin.test.ts).

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-pinned-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("a restore of a checkpoint whose participant manifest was replaced after publication", () => {
  it("is refused invalid_checkpoint_state, as verify refuses it: nothing sent, journaled or opened; the original restores", async () => {
    const { engine, fake, journal, catalog } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const path = join(catalog.dirFor("base"), "gym", "agent", "a1", "manifest.json");
    const committed = await readFile(path);
    // Valid on its own (same records, digest and count): only checkpoint.json's digest tells.
    const replaced = JSON.parse(committed.toString("utf8")) as { created_at: number };
    replaced.created_at += 1;
    await writeFile(path, `${JSON.stringify(replaced, null, 2)}\n`);
    const verified = await refusalOf(verifyCheckpoint(catalog, "base"));
    expect(verified.code).toBe("invalid_checkpoint_state");

    const sent = fake.calls.length;
    const refused = await refusalOf(engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect({ code: refused.code, detail: refused.message }).toEqual({ code: verified.code, detail: verified.message });
    expect(fake.calls.length).toBe(sent);
    expect(journal.entries.size).toBe(0);
    expect(engine.openCheckpoint).toBeNull();

    await writeFile(path, committed);
    const reply = await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.participants.every((p) => p.restored?.[0] === "r1-a1")).toBe(true);
    await engine.resume({ checkpoint_id: "base" });
  });
});

describe("the restore message pins each participant's manifest", () => {
  /** checkpoint.json's manifest_sha256 per `kind/instance`. */
  async function recordedDigests(id: string): Promise<Record<string, string>> {
    const manifest = await new CheckpointCatalog(root).get(id);
    return Object.fromEntries(manifest.participants.map((p) => [`${p.kind}/${p.instance}`, p.manifest_sha256]));
  }

  function sentDigests(calls: { kind: string; instance: string; body: Record<string, unknown> }[]): Record<string, unknown> {
    for (const c of calls) expect(RestoreRequestSchema.safeParse(c.body).success).toBe(true);
    return Object.fromEntries(calls.map((c) => [`${c.kind}/${c.instance}`, c.body.manifest_sha256]));
  }

  it("with the digest checkpoint.json records for that participant, also when a successor re-drives it", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "pin", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    const expected = await recordedDigests("pin");
    expect(new Set(Object.values(expected)).size).toBe(5);
    await first.engine.restore({ checkpoint_id: "pin", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(sentDigests(first.fake.ops("restore"))).toEqual(expected);

    // Its leader died before the controller got the reply: the successor sends it again, pinned alike.
    const entry = structuredClone(first.journal.entries.get("pin")!);
    const second = makeEngine(root);
    await second.journal.record({ ...entry, state: "restoring" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "pin", action: "restored" }]);
    expect(sentDigests(second.fake.ops("restore"))).toEqual(expected);
  });

  it("a successor finding the checkpoint directory replaced by a symbolic link re-sends nothing: the restore fails (get refuses the link) and is cleaned up", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "pin", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    await first.engine.restore({ checkpoint_id: "pin", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const entry = structuredClone(first.journal.entries.get("pin")!);
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-pinned-outside-"));
    try {
      await rename(join(root, "pin"), join(outside, "pin"));
      await symlink(join(outside, "pin"), join(root, "pin"));
      const second = makeEngine(root);
      await second.journal.record({ ...entry, state: "restoring" });
      expect(await second.engine.recover()).toEqual([{ checkpoint_id: "pin", action: "retired_resumed" }]);
      expect(second.fake.ops("restore")).toEqual([]);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });
});
