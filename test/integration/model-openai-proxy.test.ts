import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MAX_ATTEMPT, type Op } from "../../protocol/index.js";
import { controlRequest, phase as controlPhase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { BACKEND_ENTRY, PROXY_ENTRY, commonArgs, spawnServer, type SpawnedServer } from "../e2e/model-processes.js";
import { waitUntil } from "../support/wait-until.js";
import { backendAdmin } from "../support/policy-backend-admin.js";
import { createCheckpointDir } from "../support/checkpoint-dir.js";

const TOKEN = "model-it-secret";
const DEPLOYMENT = "modelit";
let nats: NatsFixture;
let root: string;
let backend: SpawnedServer;
let proxy: SpawnedServer;

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-model-it-"));
  backend = await spawnServer("backend", BACKEND_ENTRY, commonArgs(nats.server.url, DEPLOYMENT, "policy_backend", TOKEN, ["--token-delay-ms", "2"]));
  proxy = await spawnServer(
    "proxy",
    PROXY_ENTRY,
    commonArgs(nats.server.url, DEPLOYMENT, "policy_model", TOKEN, ["--upstream", `${backend.url}/v1`, "--checkpoint-root", root, "--ledger-dir", join(root, "ledger")]),
  );
});

afterAll(async () => {
  await proxy?.kill();
  await backend?.kill();
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

const control = (op: Op, body: object) => controlRequest(nats.nc, { deployment: DEPLOYMENT, kind: "model", instance: "policy_model", token: TOKEN }, op, body);
const phase = (id: string, extra: object = {}, seconds = 20) => controlPhase(id, extra, seconds);
const admin = (path: string, body?: object) => backendAdmin(backend.url, path, body);
const capture = async (path: string, init: RequestInit = {}): Promise<any> =>
  (await fetch(`${proxy.url}/ng-capture/v1/${path}`, { ...init, headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" } })).json();

const client = (key: string) => new OpenAI({ baseURL: `${proxy.url}/ng-rollout/${key}/v1`, apiKey: "unused", maxRetries: 0, timeout: 20_000 });
const TOOLS = [{ type: "function" as const, function: { name: "calculator", parameters: { type: "object", properties: { expression: { type: "string" } } } } }];
const FIRST = [
  { role: "system" as const, content: "calculator agent" },
  { role: "user" as const, content: "Compute: 6 * 7" },
];

describe("attach proxy with the real openai client", () => {
  it("passes non-streaming and streaming completions through and records a lineage chain", async () => {
    await admin("/admin/reset", {});
    const openai = client("chain");
    const first = await openai.chat.completions.create({ model: "policy", messages: FIRST, tools: TOOLS });
    const call = first.choices[0]!.message.tool_calls![0]!;
    expect(call.type === "function" && call.function.arguments).toBe('{"expression":"6 * 7"}');
    const stream = await openai.chat.completions.create({
      model: "policy",
      stream: true,
      tools: TOOLS,
      messages: [...FIRST, { role: "assistant", content: null, tool_calls: [call] }, { role: "tool", tool_call_id: call.id, content: '{"result":"42"}' }],
    });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    expect(text).toBe("42");

    const { calls } = await admin("/admin/calls");
    expect(calls.map((c: any) => [c.capture_key, c.message_count, c.stream])).toEqual([
      ["chain", 2, false],
      ["chain", 4, true],
    ]);
    expect(calls[0].parent_call_id).toBeNull();
    expect(calls[1].parent_call_id).toBe(calls[0].model_call_id);
    const manifest = await capture("ledger/chain");
    expect(manifest.records.map((r: any) => [r.model_call_id, r.parent_call_id, r.staging_key, r.usage?.completion_tokens])).toEqual([
      [calls[0].model_call_id, null, `stage/${calls[0].model_call_id}`, 6],
      [calls[1].model_call_id, calls[0].model_call_id, `stage/${calls[1].model_call_id}`, 1],
    ]);
    const files = await readdir(join(root, "ledger"));
    expect(files).toContain("chain.lineage.jsonl");
  });

  it("a streaming response blocks prepare; a finished stream lets it commit with staging keys", async () => {
    await admin("/admin/reset", {});
    await admin("/admin/gate", { after_chunks: 2 });
    const stream = await client("streamer").chat.completions.create({ model: "policy", stream: true, messages: FIRST, metadata: { answer_tokens: "8" } });
    const iterator = stream[Symbol.asyncIterator]();
    await iterator.next(); // the response has started
    const early = await control("prepare", phase("c-stream", {}, 1));
    expect(early.phase).toBe("preparing");
    expect(early.report.blockers).toEqual(["streamer"]);
    expect(early.report.counts).toMatchObject({ inflight: 1, held: 0, cut: 0 });
    await admin("/admin/ungate", {});
    for (;;) if ((await iterator.next()).done) break;
    const prepared = await control("prepare", phase("c-stream"));
    expect(prepared.phase).toBe("prepared");
    createCheckpointDir(root, "c-stream"); // as the coordinator does before any commit
    const commit = await control("commit", phase("c-stream", { checkpoint_dir: join(root, "c-stream"), episode_ids: [{ rollout_id: "streamer", attempt: 0 }, { rollout_id: "nobody", attempt: 0 }] }));
    expect(commit.phase).toBe("committed");
    expect(commit.episode_ids).toEqual(["nobody", "streamer"]); // an episode with no call gets an empty record
    const { calls } = await admin("/admin/calls");
    expect(commit.extras.staging_keys).toEqual([`stage/${calls[0].model_call_id}`]);
    expect(await control("resume", phase("c-stream"))).toEqual({ phase: "idle", idempotent: false });
  });

  it("refuses new calls while closed, holds an undelivered response (cut once), excludes it from the commit, delivers it on resume", async () => {
    await admin("/admin/reset", {});
    const openai = client("holder");
    await openai.chat.completions.create({ model: "policy", messages: FIRST, tools: TOOLS });
    await admin("/admin/hold", { after: 1 });
    const pending = openai.chat.completions.create({ model: "policy", messages: [...FIRST, { role: "user", content: "again" }], stream: true });
    await waitUntil(async () => (await admin("/admin/calls")).calls.length === 2, "the second call at the backend");
    const prepared = await control("prepare", phase("c-held"));
    expect(prepared.phase).toBe("prepared");
    expect(prepared.report.counts).toMatchObject({ inflight: 1, cut: 1, cut_failed: 0, cut_skipped: 0 });
    const refused = await client("late").chat.completions.create({ model: "policy", messages: FIRST }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(OpenAI.APIError);
    expect((refused as InstanceType<typeof OpenAI.APIError>).status).toBe(409);
    expect(((refused as any).error as any)?.code ?? (refused as any).error?.error?.code).toBe("admission_closed");
    expect(await capture("ledger/holder", { method: "DELETE" })).toMatchObject({ error: { code: "invalid_phase" } });
    await admin("/admin/release", {});
    await waitUntil(async () => (await capture("status")).counts.held === 1, "the held response");
    const { cuts, calls } = await admin("/admin/calls").then(async (c) => ({ ...c, cuts: (await admin("/admin/cuts")).cuts }));
    expect(cuts.map((c: any) => [c.checkpoint_id, c.model_call_ids])).toEqual([["c-held", [calls[1].model_call_id]]]);
    createCheckpointDir(root, "c-held"); // as the coordinator does before any commit
    const commit = await control("commit", phase("c-held", { checkpoint_dir: join(root, "c-held"), episode_ids: [{ rollout_id: "holder", attempt: 0 }] }));
    const recordsFile = (await readdir(join(root, "c-held/gym/model/policy_model"))).find((f) => f.startsWith("records-"))!;
    const record = JSON.parse((await readFile(join(root, "c-held/gym/model/policy_model", recordsFile), "utf8")).trim());
    expect(record.rows.map((r: any) => r.model_call_id)).toEqual([calls[0].model_call_id]);
    expect(record.generation_cuts).toHaveLength(1);
    expect(record.generation_cuts[0].model_call_id).toBe(calls[1].model_call_id);
    expect(commit.extras.staging_keys).toEqual([`stage/${calls[0].model_call_id}`, ...record.generation_cuts[0].continuation.staging_keys].sort());
    await control("resume", phase("c-held"));
    let text = "";
    for await (const chunk of await pending) text += chunk.choices[0]?.delta?.content ?? "";
    expect(text).toBe("ok");
    expect((await capture("ledger/holder")).records).toHaveLength(2);
    // An attempt no episode can have is bad input: refused, nothing removed.
    const beyond = await capture("ledger/retire", { method: "POST", body: JSON.stringify({ rollout_id: "holder", attempt: MAX_ATTEMPT + 1 }) });
    expect(beyond).toMatchObject({ error: { code: "invalid_request" } });
    expect((await capture("ledger/holder")).records).toHaveLength(2);
    expect((await capture("ledger/retire", { method: "POST", body: JSON.stringify({ rollout_id: "holder", attempt: 0 }) })).retired).toEqual(["holder"]);
    expect((await capture("ledger/holder")).records).toEqual([]);
  });

  it("a failed cut never blocks the checkpoint", async () => {
    await admin("/admin/reset", {});
    await admin("/admin/cut-mode", { mode: "bad_echo" });
    await admin("/admin/hold", { after: 0 });
    const pending = client("failing").chat.completions.create({ model: "policy", messages: FIRST });
    await waitUntil(async () => (await admin("/admin/calls")).calls.length === 1, "the call at the backend");
    const prepared = await control("prepare", phase("c-fail"));
    expect(prepared.phase).toBe("prepared");
    expect(prepared.report.counts).toMatchObject({ cut: 0, cut_failed: 1 });
    createCheckpointDir(root, "c-fail"); // as the coordinator does before any commit
    const commit = await control("commit", phase("c-fail", { checkpoint_dir: join(root, "c-fail"), episode_ids: [{ rollout_id: "failing", attempt: 0 }] }));
    expect(commit.episode_ids).toEqual(["failing"]); // its record is empty: no delivered call, no cut
    await control("resume", phase("c-fail"));
    await admin("/admin/release", {});
    expect((await pending).choices[0]!.message.content).toBe("ok");
  });
});
