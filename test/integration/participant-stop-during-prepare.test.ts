import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

// stop() waits for the answers being computed (the reference servers' SIGTERM path awaits it
// first): a prepare waiting for a blocker must be answered now, not at its deadline, and as not
// prepared, so the coordinator aborts the checkpoint instead of committing a process that is gone.
const DEPLOYMENT = "stopprep";
const TOKEN = "integration-secret";
const PREPARE_SECONDS = 20;
let nats: NatsFixture;
let root: string;
const handles: ParticipantHandle<ScriptRecord>[] = [];

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-it-"));
});
afterAll(async () => {
  await Promise.allSettled(handles.map((h) => h.stop()));
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

describe("participant stop() while a prepare waits for readiness", () => {
  it("returns well before the prepare's deadline, and the prepare is answered preparing with its blockers", async () => {
    const kind = new ScriptableKind("environment");
    kind.setBlockers(["r1"]);
    const participant = await startParticipant({ nc: await nats.connect(), deployment: DEPLOYMENT, instance: "env", token: TOKEN, adapter: kind, checkpointRoot: root });
    handles.push(participant);
    const target = { deployment: DEPLOYMENT, kind: "environment" as const, instance: "env", token: TOKEN };
    const prepare = controlRequest(nats.nc, target, "prepare", phase("c1", {}, PREPARE_SECONDS), (PREPARE_SECONDS + 10) * 1000);
    await waitUntil(async () => (await controlRequest(nats.nc, target, "status", {})).phase === "preparing", "the prepare waiting for its blocker");

    const started = Date.now();
    await participant.stop();
    const stoppedAfterMs = Date.now() - started;
    const reply = await prepare;
    expect({ phase: reply.phase, blockers: reply.report?.blockers }).toEqual({ phase: "preparing", blockers: ["r1"] });
    expect(stoppedAfterMs).toBeLessThan(3_000);
  }, 40_000);
});
