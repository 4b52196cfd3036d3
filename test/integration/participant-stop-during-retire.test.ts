import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

// A kind's retire (and forget) waits for the attempt's in-flight calls, which the reference servers
// cut only after the participant stopped: a SIGTERM while one waited lasted until its deadline (a
// minute by default). stop() cuts it short instead, answered `unreachable` (send it again to the
// restart), as for a participant gone meanwhile.
const DEPLOYMENT = "stopret";
const TOKEN = "integration-secret";
const OP_SECONDS = 20;
let nats: NatsFixture;
let root: string;
const handles: ParticipantHandle<ScriptRecord>[] = [];
const releases: (() => void)[] = [];

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-it-"));
});
afterAll(async () => {
  for (const release of releases) release();
  await Promise.allSettled(handles.map((h) => h.stop()));
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

describe("participant stop() while a retire or forget waits for its kind", () => {
  const cases = [
    { op: "retire" as const, body: { episode_ids: [{ rollout_id: "r1", attempt: 1 }] } },
    { op: "forget" as const, body: { rollout_ids: ["r1"] } },
  ];
  it.each(cases)("$op: stop() returns well before the op's deadline, and the op is answered unreachable", async ({ op, body }) => {
    const kind = new ScriptableKind("environment");
    kind.delay(op, new Promise<void>((resolve) => releases.push(resolve)));
    const instance = `env-${op}`;
    const participant = await startParticipant({ nc: await nats.connect(), deployment: DEPLOYMENT, instance, token: TOKEN, adapter: kind, checkpointRoot: root });
    handles.push(participant);
    const target = { deployment: DEPLOYMENT, kind: "environment" as const, instance, token: TOKEN };
    const reply = controlRequest(nats.nc, target, op, phase("c1", body, OP_SECONDS), (OP_SECONDS + 10) * 1000);
    await waitUntil(() => kind.hooks().includes(op), `the ${op} running in the kind`);

    const stopped = participant.stop().then(() => "stopped" as const);
    const gaveUp = new Promise<"still stopping">((resolve) => setTimeout(() => resolve("still stopping"), 5_000).unref());
    expect(await Promise.race([stopped, gaveUp])).toBe("stopped");
    expect((await reply).error?.code).toBe("unreachable");
  }, 40_000);
});
