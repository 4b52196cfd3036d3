import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { canonicalDigest, type Kind, type Op } from "../../protocol/index.js";
import {
  FsCheckpointStorage,
  WriteGate,
  startParticipant,
  type ParticipantHandle,
  type ParticipantKind,
} from "../../participants/index.js";
import { EnvironmentKind } from "../../participants/kinds/environment/index.js";
import { createResourcesApp } from "../../participants/kinds/resources/index.js";
import { CounterServer } from "../../participants/gym/resources-server/counter-server.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";

// A restore scope naming two attempts of one rollout (r#0 and r#1) would continue the rollout
// twice: r#0 as r-a1 and r#1 as r-a2, while the source fence (the highest source attempt, r#1)
// refuses r-a1 at once, so the reply promised a replacement nobody can run. Each kind did
// something else with it (environment and resources installed both, the model's second record
// deleted the first one's ledger, the agent refused the checkpoint as corrupt). It is refused
// with invalid_request before anything changes, so the same checkpoint restores with a fixed scope.

const DEPLOYMENT = "itest-scope";
const TOKEN = "scope-secret";
let nats: NatsFixture;
let root: string;
const started: ParticipantHandle<any>[] = [];
const closers: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-scope-"));
});

afterEach(async () => {
  for (const p of started.splice(0)) await p.stop();
  for (const close of closers.splice(0)) await close();
});

afterAll(async () => {
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

async function serve(kind: Kind, instance: string, adapter: ParticipantKind<any>) {
  const handle = await startParticipant({ nc: nats.nc, deployment: DEPLOYMENT, instance, token: TOKEN, adapter, checkpointRoot: root, announce: false });
  started.push(handle);
  return (op: Op, body: unknown) => controlRequest(nats.nc, { deployment: DEPLOYMENT, kind, instance, token: TOKEN }, op, body, 10_000);
}

const writeRecords = (id: string, kind: Kind, instance: string, records: object[]) =>
  new FsCheckpointStorage().write({ checkpointDir: join(root, id), checkpointId: id, kind, instance }, records as never, {
    gate: new WriteGate(),
    createdAt: Date.now() / 1000,
    extra: {},
  });

const both = [
  { rollout_id: "r", attempt: 0 },
  { rollout_id: "r", attempt: 1 },
];

describe("a restore scope naming two attempts of one rollout", () => {
  it("environment: refused invalid_request, nothing installed or fenced; the same checkpoint restores with one attempt", async () => {
    const digest = canonicalDigest({ task: 1 });
    await writeRecords("c-env", "environment", "env0", [
      { episode_id: both[0], task_digest: digest, boundary: { step: 1 } },
      { episode_id: both[1], task_digest: digest, boundary: { step: 2 } },
    ]);
    const kind = new EnvironmentKind();
    const send = await serve("environment", "env0", kind);
    const before = await send("status", {});

    const refused = await send("restore", phase("c-env", { checkpoint_dir: join(root, "c-env"), episode_ids: both }));
    expect(refused.error?.code).toBe("invalid_request");
    expect(refused.error.detail).toContain("r");
    expect(await send("status", {})).toEqual(before);
    expect(kind.episodes.pendingKeys()).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);

    // Nothing was fenced or cached: the corrected scope restores the same checkpoint.
    const restored = await send("restore", phase("c-env", { checkpoint_dir: join(root, "c-env"), episode_ids: [both[1]] }));
    expect(restored).toMatchObject({ phase: "restored", restored: ["r-a2"] });
    expect(kind.episodes.pendingKeys()).toEqual(["r-a2"]);
    expect(await send("resume", phase("c-env"))).toEqual({ phase: "idle", idempotent: false });
  });

  it("resources: refused invalid_request, no session state handed to the server", async () => {
    await writeRecords("c-res", "resources", "res0", [
      { episode_id: both[0], session_id: "sessionAAAA", state: { count: 1 }, owner: null },
      { episode_id: both[1], session_id: "sessionBBBB", state: { count: 5 }, owner: null },
    ]);
    const server = new CounterServer();
    const { app, kind } = await createResourcesApp(server);
    closers.push(() => app.close());
    const send = await serve("resources", "res0", kind);

    const refused = await send("restore", phase("c-res", { checkpoint_dir: join(root, "c-res"), episode_ids: both }));
    expect(refused.error?.code).toBe("invalid_request");
    expect([...server.counters.keys()]).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);
    expect((await send("status", {})).phase).toBe("idle");

    const restored = await send("restore", phase("c-res", { checkpoint_dir: join(root, "c-res"), episode_ids: [both[0]] }));
    expect(restored).toMatchObject({ phase: "restored", restored: ["r-a1"] });
    expect([...server.counters]).toEqual([["sessionAAAA", 1]]);
    expect(await send("resume", phase("c-res"))).toEqual({ phase: "idle", idempotent: false });
  });
});
