import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerApi } from "../../coordinator/api/nats-api.js";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { canonicalDigest, captureKey } from "../../protocol/index.js";
import { FOUR, makeEngine, uuidScope, writers } from "../unit/coordinator/fake-participants.js";
import { startNats, type NatsFixture } from "../support/nats.js";

/** The NATS controller API at a scale whose commit and get replies exceed one message in full. */
let nats: NatsFixture;
let root: string;
beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-reply-size-"));
});
afterAll(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});


describe("NATS controller API reply size", () => {
  it("answers commit and get of 6,800 UUID rollouts held by four participants (1.06 MB in full) with lists left out", async () => {
    const { engine, fake } = makeEngine(root, { members: FOUR });
    const api = new NatsControllerApi({ nc: nats.nc, deployment: "unit", token: "ctl", engine });
    await api.start();
    const client = new NatsControllerClient({ nc: await nats.connect(), deployment: "unit", token: "ctl" });
    try {
      const scope = uuidScope(6800);
      const keys = scope.map(captureKey).sort();
      for (const m of FOUR) fake.exported.set(`${m.kind}.${m.instance}`, keys);

      expect((await client.prepare({ checkpoint_id: "big" })).prepared).toBe(true);
      const commit = await client.commit({ checkpoint_id: "big", episode_ids: scope });
      expect(commit.participants).toHaveLength(4);
      const leftOut = commit.participants.filter((p) => p.episode_ids === null);
      expect(leftOut.length).toBeGreaterThan(0);
      for (const p of leftOut) expect(p).toMatchObject({ episode_count: 6800, episode_ids_sha256: canonicalDigest(keys) });
      // A retry answers the same fitted reply.
      expect(await client.commit({ checkpoint_id: "big", episode_ids: scope })).toEqual(commit);

      await client.publish({ checkpoint_id: "big", controller_state: { inline: { step: 7 } } });
      const got = await client.get("big");
      expect(got.manifest.controller_state).toEqual({ inline: { step: 7 } });
      expect(got.manifest.participants.some((p) => p.episode_ids === null)).toBe(true);
      await client.resume({ checkpoint_id: "big" });
    } finally {
      await api.stop();
    }
  });
});
