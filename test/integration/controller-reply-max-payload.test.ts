import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerApi } from "../../coordinator/api/nats-api.js";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import type { CheckpointEngine } from "../../coordinator/engine/checkpoint-engine.js";
import type { CtlReplyOf } from "../../protocol/index.js";
import { NatsServerProcess } from "../support/nats.js";

/**
 * A deployment may configure the NATS server's max_payload below the 1 MiB control-message limit.
 * A controller reply between the two made nats.js throw from msg.respond: the coordinator sent
 * nothing, and the controller waited for its whole reply timeout (for an op sent without a
 * deadline, as long as the coordinator leads) and then retried into the same silence. The reply
 * is fitted to the server's max_payload instead (lists left out), else `reply_too_large`.
 */
const DEPLOYMENT = "ctlmaxpayload";
const TOKEN = "ctl-token";
const MAX_PAYLOAD = 65536;
let dir: string;
let server: NatsServerProcess;
let nc: NatsConnection;
let api: NatsControllerApi;

function statusReply(participants: number): CtlReplyOf<"status"> {
  const blockers = Array.from({ length: 100 }, (_, i) => `rollout-with-a-long-name-${i}`);
  return {
    deployment: DEPLOYMENT,
    coordinator: { id: "c1", leader: true, ready: true, epoch: 1 },
    checkpoint: null,
    participants: Array.from({ length: participants }, (_, i) => ({
      kind: "environment" as const,
      instance: `env-${i}`,
      reachable: true,
      phase: "idle" as const,
      checkpoint_id: null,
      lease_expires_at: null,
      epoch: 1,
      blockers,
      blocker_count: blockers.length,
      error: null,
    })),
  };
}

const listReply: CtlReplyOf<"list"> = {
  latest: null,
  checkpoints: Array.from({ length: 1000 }, (_, i) => ({ checkpoint_id: `checkpoint-${i}`, published_at: 1, epoch: 1, participants: 4, stop: false })),
};

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ctl-maxpayload-"));
  const config = join(dir, "nats.conf");
  await writeFile(config, `max_payload: ${MAX_PAYLOAD}\n`);
  server = await NatsServerProcess.start({ args: ["-c", config] });
  nc = await connect({ servers: server.url });
  const engine = { status: async () => statusReply(40), list: async () => listReply } as unknown as CheckpointEngine;
  api = new NatsControllerApi({ nc, deployment: DEPLOYMENT, token: TOKEN, engine });
  await api.start();
});

afterAll(async () => {
  await api?.stop();
  await nc?.close();
  await server?.dispose();
  await rm(dir, { recursive: true, force: true });
});

const client = () => new NatsControllerClient({ nc, deployment: DEPLOYMENT, token: TOKEN, timeoutMs: 5_000, leaderWaitMs: 0 });

describe("a controller reply over the NATS server's max_payload (below 1 MiB)", () => {
  it("leaves lists out to fit the server's max_payload, as past 1 MiB", async () => {
    expect(nc.info?.max_payload).toBe(MAX_PAYLOAD);
    expect(Buffer.byteLength(JSON.stringify(statusReply(40)))).toBeGreaterThan(MAX_PAYLOAD);
    const status = await client().status();
    expect(status.participants).toHaveLength(40);
    expect(status.participants.every((p) => p.blocker_count === 100)).toBe(true);
    expect(status.participants.some((p) => p.blockers.length === 0)).toBe(true);
  });

  it("answers reply_too_large when nothing can be left out, instead of no reply (outcome_unknown after the timeout)", async () => {
    expect(Buffer.byteLength(JSON.stringify(listReply))).toBeGreaterThan(MAX_PAYLOAD);
    const started = Date.now();
    const error = await client().list().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toMatchObject({ code: "reply_too_large" });
    expect((error as Error).message).toContain("max_payload");
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});
