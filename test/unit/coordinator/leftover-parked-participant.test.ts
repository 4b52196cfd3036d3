import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { MANIFEST_SCHEMA_VERSION } from "../../../protocol/index.js";
import { makeEngine, writeParticipant, writers } from "../coordinator/fake-participants.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-engine-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/**
 * A reused id whose directory holds the participants' files of an earlier attempt (clearLeftover
 * takes them away at prepare) while a participant the earlier abort never reached is still parked
 * `committed` in it: that participant would answer the new prepare and commit from its reply
 * cache, naming the very files taken away, and LATEST would name a manifest that is gone. The
 * prepare is refused instead (`checkpoint_conflict`, resume the id first), nothing moved or sent.
 */
describe("a reused id whose gym/ belongs to a participant still parked in it", () => {
  it("does not publish a checkpoint whose manifest was moved away", async () => {
    // e1 committed "step-1200" in the earlier attempt and is still parked in it
    const entry = await writeParticipant(root, "step-1200", "environment", "e1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    const { engine, fake, writer } = makeEngine(root);
    fake.state.set("environment.e1", { phase: "committed", checkpoint_id: "step-1200" });
    const manifestText = readFileSync(join(root, "step-1200", entry.manifest_path), "utf8");
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      // what ParticipantControlPlane answers from its reply cache for the id it is parked in
      if (subject.endsWith(".environment.e1.prepare")) {
        return JSON.stringify({ phase: "prepared", report: { ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [] } });
      }
      if (subject.endsWith(".environment.e1.commit")) {
        return JSON.stringify({
          phase: "committed",
          manifest: { ...JSON.parse(manifestText), schema_version: MANIFEST_SCHEMA_VERSION },
          manifest_path: entry.manifest_path,
          manifest_sha256: entry.manifest_sha256,
          episode_ids: entry.episode_ids,
          extras: {},
        });
      }
      return request(subject, body, options);
    };
    const sent = () => fake.calls.filter((c) => c.op !== "status").length;
    const before = sent();
    const outcome = await engine.checkpoint({ checkpoint_id: "step-1200", episode_ids: null, stop: false, controller_state: null }).then(
      () => "published",
      (error: { code: string }) => error.code,
    );
    await writer.settled();
    expect(outcome).toBe("checkpoint_conflict");
    expect(sent()).toBe(before);
    expect(existsSync(join(root, "step-1200", entry.manifest_path))).toBe(true);
  });
});
