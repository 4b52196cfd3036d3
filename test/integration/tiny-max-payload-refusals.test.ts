import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerApi } from "../../coordinator/api/nats-api.js";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import type { CheckpointEngine } from "../../coordinator/engine/checkpoint-engine.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { CheckpointError, type CtlReplyOf } from "../../protocol/index.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { NatsServerProcess } from "../support/nats.js";

/**
 * A NATS server whose max_payload is a few KiB, below the longest refusal detail (4096 characters).
 * A refusal that did not fit was answered `reply_too_large` ("<op> ran, but its reply exceeds…"),
 * whose catalog meaning is "the operation succeeded": a controller told a prepare it refused had
 * run. The refusal keeps its code, its detail cut to fit. And `reply_too_large` itself says the
 * reply's size and the server's limit, and still reaches the caller where its own detail would not fit.
 */
const MAX_PAYLOAD = 1024;
const DEPLOYMENT = "tinypayload";
const TOKEN = "tiny-token";
let dir: string;
let server: NatsServerProcess;
let nc: NatsConnection;
let api: NatsControllerApi;
let kind: ScriptableKind;
let participant: ParticipantHandle<ScriptRecord>;

const LONG_DETAIL = `environment/env-1: not at a safe boundary (${Array.from({ length: 200 }, (_, i) => `rollout-${i}`).join(", ")})`;
const listReply: CtlReplyOf<"list"> = {
  latest: null,
  checkpoints: Array.from({ length: 100 }, (_, i) => ({ checkpoint_id: `checkpoint-${i}`, published_at: 1, epoch: 1, participants: 4, stop: false })),
};

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-tiny-payload-"));
  const config = join(dir, "nats.conf");
  await writeFile(config, `max_payload: ${MAX_PAYLOAD}\n`);
  server = await NatsServerProcess.start({ args: ["-c", config] });
  nc = await connect({ servers: server.url });
  const engine = {
    prepare: async () => {
      throw new CheckpointError("prepare_incomplete", LONG_DETAIL);
    },
    list: async () => listReply,
  } as unknown as CheckpointEngine;
  api = new NatsControllerApi({ nc, deployment: DEPLOYMENT, token: TOKEN, engine });
  await api.start();
  kind = new ScriptableKind("environment");
  participant = await startParticipant({ nc, deployment: DEPLOYMENT, instance: "env0", token: TOKEN, adapter: kind });
});

afterAll(async () => {
  await participant?.stop();
  await api?.stop();
  await nc?.close();
  await server?.dispose();
  await rm(dir, { recursive: true, force: true });
});

const client = () => new NatsControllerClient({ nc, deployment: DEPLOYMENT, token: TOKEN, timeoutMs: 5_000, leaderWaitMs: 0 });
const refusalOf = (call: Promise<unknown>) =>
  call.then(
    () => undefined,
    (e: unknown) => e as CheckpointError,
  );

describe(`a NATS server whose max_payload is ${MAX_PAYLOAD} bytes`, () => {
  it("a controller op's refusal longer than that keeps its code, its detail cut to fit; never reply_too_large (which says the op succeeded)", async () => {
    expect(nc.info?.max_payload).toBe(MAX_PAYLOAD);
    expect(Buffer.byteLength(JSON.stringify(new CheckpointError("prepare_incomplete", LONG_DETAIL).toReply()))).toBeGreaterThan(MAX_PAYLOAD);
    const error = await refusalOf(client().prepare({ checkpoint_id: "c1" }));
    expect(error?.code).toBe("prepare_incomplete");
    expect(error?.message).toMatch(/^environment\/env-1: not at a safe boundary \(rollout-0, rollout-1, /);
    expect(error?.message).toMatch(new RegExp(`… \\(${LONG_DETAIL.length} characters; the NATS server's max_payload is ${MAX_PAYLOAD} bytes\\)$`));
  });

  it("reply_too_large names the reply's size and the server's max_payload", async () => {
    const error = await refusalOf(client().list());
    expect(error?.code).toBe("reply_too_large");
    expect(error?.message).toMatch(new RegExp(`^list succeeded, but its \\d+-byte reply exceeds the NATS server's max_payload \\(${MAX_PAYLOAD} bytes\\)`));
    const size = Number(/its (\d+)-byte reply/.exec(error!.message)![1]);
    expect(size).toBeGreaterThan(MAX_PAYLOAD);
  });

  it("a participant's refusal longer than that keeps its code too, its detail cut to fit", async () => {
    kind.failNext("closeAdmission", new CheckpointError("invalid_request", LONG_DETAIL));
    const reply = await controlRequest(nc, { deployment: DEPLOYMENT, kind: "environment", instance: "env0", token: TOKEN }, "prepare", phase("p1"), 3000);
    expect(reply.error?.code).toBe("invalid_request");
    expect(Buffer.byteLength(JSON.stringify(reply))).toBeLessThanOrEqual(MAX_PAYLOAD);
    expect(reply.error.detail).toMatch(/^environment\/env-1: not at a safe boundary \(rollout-0, /);
  });
});

describe("a NATS server whose max_payload is below reply_too_large's own detail (128 bytes)", () => {
  let small: NatsServerProcess;
  let snc: NatsConnection;
  let sapi: NatsControllerApi;
  beforeAll(async () => {
    const config = join(dir, "small.conf");
    await writeFile(config, "max_payload: 128\n");
    small = await NatsServerProcess.start({ args: ["-c", config] });
    snc = await connect({ servers: small.url });
    sapi = new NatsControllerApi({ nc: snc, deployment: DEPLOYMENT, token: TOKEN, engine: { list: async () => listReply } as unknown as CheckpointEngine });
    await sapi.start();
  });
  afterAll(async () => {
    await sapi?.stop();
    await snc?.close();
    await small?.dispose();
  });

  it("still answers reply_too_large (its detail cut), not nothing (the controller's timeout, outcome_unknown)", async () => {
    const started = performance.now();
    const error = await refusalOf(new NatsControllerClient({ nc: snc, deployment: DEPLOYMENT, token: TOKEN, timeoutMs: 5_000, leaderWaitMs: 0 }).list());
    expect(error?.code).toBe("reply_too_large");
    // As much of "list succeeded, but its N-byte reply exceeds…" as fits, then why it was cut.
    expect(error?.message).toMatch(/^list su.*… \(\d+ characters; the NATS server's max_payload is 128 bytes\)$/);
    expect(performance.now() - started).toBeLessThan(5_000);
  });
});
