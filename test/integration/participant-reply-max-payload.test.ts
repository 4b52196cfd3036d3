import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import { canonicalDigest } from "../../protocol/index.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { NatsServerProcess } from "../support/nats.js";

/**
 * A reply within the 1 MiB control-message limit can still exceed the server's max_payload when a
 * deployment configures it lower. nats.js then throws from msg.respond: the participant sent no
 * reply at all, so the coordinator waited for its timeout and took the op for an unknown outcome,
 * retrying it to the same end. It answers `reply_too_large` (the op ran) instead.
 */
const DEPLOYMENT = "maxpayload";
const TOKEN = "integration-secret";
let dir: string;
let server: NatsServerProcess;
let nc: NatsConnection;
let kind: ScriptableKind;
let participant: ParticipantHandle<ScriptRecord>;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-maxpayload-"));
  const config = join(dir, "nats.conf");
  await writeFile(config, "max_payload: 65536\n");
  server = await NatsServerProcess.start({ args: ["-c", config] });
  nc = await connect({ servers: server.url });
  kind = new ScriptableKind("environment");
  participant = await startParticipant({ nc, deployment: DEPLOYMENT, instance: "env0", token: TOKEN, adapter: kind });
});

afterAll(async () => {
  await participant?.stop();
  await nc?.close();
  await server?.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe("a participant's reply over the server's max_payload", () => {
  it("is answered reply_too_large, not left without an answer", async () => {
    expect(nc.info?.max_payload).toBe(65536);
    kind.statusExtras = () => ({ note: "x".repeat(100_000) });
    const reply = await controlRequest(nc, { deployment: DEPLOYMENT, kind: "environment", instance: "env0", token: TOKEN }, "status", {}, 3000);
    expect(reply).toMatchObject({ error: { code: "reply_too_large" } });
    expect(reply.error.detail).toContain("max_payload");
  });

  it("a commit whose episode list would pass it answers with the list left out (count and digest), as over 1 MiB: a committed checkpoint is never answered reply_too_large for its list", async () => {
    const target = { deployment: DEPLOYMENT, kind: "environment" as const, instance: "env0", token: TOKEN };
    kind.statusExtras = () => ({});
    // ~4,000 capture keys: ~70 KiB of list, past the server's 64 KiB, far under 1 MiB.
    const keys = Array.from({ length: 4000 }, (_, i) => `rollout-${String(i).padStart(6, "0")}`);
    for (const key of keys) kind.addEpisode({ rollout_id: key, attempt: 0 });
    expect((await controlRequest(nc, target, "prepare", phase("c1"), 3000)).phase).toBe("prepared");
    await mkdir(join(dir, "c1")); // as the coordinator does before its commit
    const reply = await controlRequest(nc, target, "commit", phase("c1", { checkpoint_dir: join(dir, "c1"), episode_ids: null, stop: false }), 3000);
    expect(reply.error).toBeUndefined();
    expect(reply).toMatchObject({ phase: "committed", episode_ids: null, episode_count: 4000, episode_ids_sha256: canonicalDigest(keys) });
    expect((await controlRequest(nc, target, "resume", phase("c1"), 3000)).phase).toBe("idle");
  });
});
