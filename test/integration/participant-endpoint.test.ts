import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { Kvm } from "@nats-io/kv";
import { headers } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MEMBER_TTL_MS, OPS, memberKey, membersBucket, participantSubject, type Op } from "../../protocol/index.js";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { rawRequestWithHeaders } from "../support/raw-nats-request.js";
import { startNats, type NatsFixture } from "../support/nats.js";

const DEPLOYMENT = "itest";
const TOKEN = "integration-secret";
let nats: NatsFixture;
let root: string;
let kind: ScriptableKind;
let participant: ParticipantHandle<ScriptRecord>;

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-it-"));
  kind = new ScriptableKind("model");
  participant = await startParticipant({ nc: await nats.connect(), deployment: DEPLOYMENT, instance: "policy_model", token: TOKEN, adapter: kind, checkpointRoot: root });
});

afterAll(async () => {
  await participant?.stop();
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

const send = (op: Op, body: unknown, token: string | null = TOKEN) =>
  controlRequest(nats.nc, { deployment: DEPLOYMENT, kind: "model", instance: "policy_model", token }, op, body, 5000);

describe("participant control plane over a real nats-server", () => {
  it("announces itself in the membership registry with a bucket-level TTL", async () => {
    const kv = await new Kvm(nats.nc).open(membersBucket(DEPLOYMENT));
    const entry = await kv.get(memberKey("model", "policy_model"));
    expect(entry?.json()).toMatchObject({ kind: "model", instance: "policy_model", protocol_version: 1 });
    const status = await kv.status();
    expect(status.ttl).toBe(MEMBER_TTL_MS);
  });

  it("drives every op through the phase machine", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    expect((await send("status", {})).phase).toBe("idle");
    expect((await send("prepare", phase("c1"))).phase).toBe("prepared");
    expect((await send("renew", phase("c1"))).lease_expires_at).toBeGreaterThan(Date.now() / 1000);
    await mkdir(join(root, "c1")); // as the coordinator does before its commit
    const commit = await send("commit", phase("c1", { checkpoint_dir: join(root, "c1"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(commit.phase).toBe("committed");
    expect(commit.episode_ids).toEqual(["r1"]);
    expect((await send("status", {})).phase).toBe("committed");
    expect(await send("resume", phase("c1"))).toEqual({ phase: "idle", idempotent: false });

    // Restore happens in a fresh process: replace the participant with a new incarnation.
    await participant.stop();
    kind = new ScriptableKind("model");
    participant = await startParticipant({ nc: await nats.connect(), deployment: DEPLOYMENT, instance: "policy_model", token: TOKEN, adapter: kind, checkpointRoot: root });
    const restore = await send("restore", phase("c1", { checkpoint_dir: join(root, "c1"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(restore).toEqual({ phase: "restored", source_checkpoint_id: "c1", restored: ["r1-a1"], incarnation: expect.any(String) });
    expect(await send("retire", phase("c1", { episode_ids: [{ rollout_id: "r1", attempt: 1 }] }))).toEqual({ retired: ["r1-a1"] });
    expect(await send("resume", phase("c1"))).toEqual({ phase: "idle", idempotent: false });
    expect(await send("forget", phase("forget", { rollout_ids: ["r1"] }))).toEqual({ forgotten: ["r1"] });
    expect((await send("status", {})).retired_rollouts).toBe(0);
  });

  it("answers bad input with documented codes and changes nothing", async () => {
    await send("resume", phase("c-old"));
    const before = await send("status", {});
    expect((await send("prepare", phase("c9"), null)).error.code).toBe("unauthorized");
    expect((await send("prepare", phase("c9"), "wrong-token")).error.code).toBe("unauthorized");
    expect((await send("prepare", "{not json")).error.code).toBe("invalid_request");
    expect((await send("prepare", phase("c9", { surprise: 1 }))).error.code).toBe("invalid_request");
    expect((await send("prepare", { ...phase("c9"), deadline_ts: "soon" })).error.code).toBe("invalid_request");
    expect((await send("prepare", phase("../../etc"))).error.code).toBe("invalid_request");
    expect((await send("commit", phase("c9", { checkpoint_dir: "/tmp/../etc", episode_ids: null }))).error.code).toBe("invalid_request");
    expect((await send("commit", phase("c9", { checkpoint_dir: join(root, "c9"), episode_ids: null }))).error.code).toBe("invalid_phase");
    expect((await send("prepare", phase("c-old"))).error.code).toBe("stale_checkpoint");
    expect((await send("prepare", { ...phase("c9"), epoch: 0 })).error.code).toBe("stale_epoch");
    expect(await send("status", {})).toEqual(before);
  });

  it("reads the Authorization header in any case, as an HTTP server would", async () => {
    for (const name of ["authorization", "AUTHORIZATION"]) {
      const h = headers();
      h.set(name, `Bearer ${TOKEN}`);
      const reply = await nats.nc.request(participantSubject(DEPLOYMENT, "model", "policy_model", "status"), "{}", { headers: h, timeout: 5_000 });
      expect([name, reply.json<Record<string, unknown>>().phase]).toEqual([name, "idle"]);
    }
  });

  it("refuses a control token that could never authenticate (whitespace) before serving", async () => {
    for (const token of ["two words", "line\n", ""]) {
      await expect(
        startParticipant({ nc: nats.nc, deployment: DEPLOYMENT, instance: "other_model", token, adapter: new ScriptableKind("model"), checkpointRoot: root, announce: false }),
      ).rejects.toMatchObject({ code: "invalid_request" });
    }
  });

  it("answers a request whose header block nats.js cannot decode (a key with a space) unauthorized, and keeps serving that op", async () => {
    // nats.js refuses to build such a header, so it is sent over the raw client protocol, as any
    // client on the bus could. Decoding it threw out of the subscription loop: an unhandled
    // rejection, and that op was never answered again.
    const subject = participantSubject(DEPLOYMENT, "model", "policy_model", "status");
    const reply = await rawRequestWithHeaders(nats.server.url, subject, "NATS/1.0\r\nBad Key: x\r\n\r\n", "{}");
    expect(JSON.parse(reply).error.code).toBe("unauthorized");
    expect((await send("status", {})).phase).toBe("idle");
  });

  it("refuses a request whose refusal would quote it at length, with a bounded detail, and keeps serving", async () => {
    // zod's unknown-key detail repeats the key: an uncapped refusal outgrew a message and the
    // failed encode ended the process.
    const body = `{"checkpoint_id":"c9","deadline_ts":${Date.now() / 1000 + 30},"epoch":1,"${"k".repeat(300_000)}":1}`;
    const reply = await controlRequest(nats.nc, { deployment: DEPLOYMENT, kind: "model", instance: "policy_model", token: TOKEN }, "prepare", body, 20_000);
    expect(reply.error.code).toBe("invalid_request");
    expect(reply.error.detail.length).toBeLessThan(5000);
    expect((await send("status", {})).phase).toBe("idle");
  });
  /**
   * A participant of its own (whatever a request that got through did cannot reach the other tests),
   * asked each op with a valid body rewritten by `rewrite`; returns the replies' errors and whether
   * its status stayed the same.
   */
  async function askRewritten(rewrite: (op: Op, text: string) => string[]): Promise<{ errors: [Op, unknown][]; unchanged: boolean }> {
    const strict = await startParticipant({ nc: nats.nc, deployment: DEPLOYMENT, instance: "strict_model", token: TOKEN, adapter: new ScriptableKind("model"), checkpointRoot: root, announce: false });
    try {
      const ask = (op: Op, text: string) => controlRequest(nats.nc, { deployment: DEPLOYMENT, kind: "model", instance: "strict_model", token: TOKEN }, op, text, 5000);
      const scope = [{ rollout_id: "r1", attempt: 0 }];
      const dir = { checkpoint_dir: join(root, "c-strict") };
      const valid: Record<Op, object> = {
        status: { epoch: 1 },
        prepare: phase("c-strict"),
        renew: phase("c-strict"),
        commit: phase("c-strict", { ...dir, episode_ids: null }),
        restore: phase("c-strict", { ...dir, episode_ids: scope }),
        resume: phase("c-strict"),
        retire: phase("c-strict", { episode_ids: scope }),
        forget: phase("c-strict", { rollout_ids: ["r1"] }),
      };
      const before = await ask("status", "{}");
      const errors: [Op, unknown][] = [];
      for (const op of OPS) for (const text of rewrite(op, JSON.stringify(valid[op]))) errors.push([op, (await ask(op, text)).error]);
      return { errors, unchanged: isDeepStrictEqual(await ask("status", "{}"), before) };
    } finally {
      await strict.stop();
    }
  }

  it("refuses, on every op, a body naming a key twice (JSON.parse keeps the last), naming the key and changing nothing", async () => {
    // As the controller APIs do; nested too: a restore scope whose attempt JSON.parse would read as the last one.
    const { errors, unchanged } = await askRewritten((op, text) => [
      text.replace('"epoch":1', '"epoch":1,"epoch":1'),
      ...(op === "restore" ? [text.replace('"attempt":0', '"attempt":0,"attempt":5')] : []),
    ]);
    const refusal = (key: string) => ({ code: "invalid_request", detail: expect.stringContaining(`key "${key}" appears twice in one object`) });
    expect(errors).toEqual(OPS.flatMap((op) => [[op, refusal("epoch")], ...(op === "restore" ? [[op, refusal("attempt")]] : [])]));
    expect(unchanged).toBe(true);
  });

  it("refuses, on every op, an integer literal a double cannot hold exactly (JSON.parse rounds it), naming it and changing nothing", async () => {
    const { errors, unchanged } = await askRewritten((_op, text) => [text.replace('"epoch":1', '"epoch":9007199254740993')]);
    expect(errors).toEqual(OPS.map((op) => [op, { code: "invalid_request", detail: expect.stringContaining("integer 9007199254740993 ") }]));
    expect(unchanged).toBe(true);
  });
});
