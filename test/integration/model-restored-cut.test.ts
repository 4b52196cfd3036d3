import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Op } from "../../protocol/index.js";
import { controlRequest, phase as controlPhase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { BACKEND_ENTRY, PROXY_ENTRY, commonArgs, spawnServer, type SpawnedServer } from "../e2e/model-processes.js";
import { waitUntil } from "../support/wait-until.js";
import { backendAdmin } from "../support/policy-backend-admin.js";
import { createCheckpointDir } from "../support/checkpoint-dir.js";

/**
 * A restored generation cut is consumed only by a re-issued call whose conversation matches: the
 * real backend and two attach-proxy processes (the second one fresh, after the first was killed),
 * driven over NATS.
 */
const TOKEN = "restored-cut-secret";
const DEPLOYMENT = "modelcut";
let nats: NatsFixture;
let root: string;
let backend: SpawnedServer;
let proxy: SpawnedServer | undefined;

const proxyArgs = () => commonArgs(nats.server.url, DEPLOYMENT, "policy_model", TOKEN, ["--upstream", `${backend.url}/v1`, "--checkpoint-root", root, "--ledger-dir", join(root, "ledger")]);

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-model-cut-"));
  backend = await spawnServer("backend", BACKEND_ENTRY, commonArgs(nats.server.url, DEPLOYMENT, "policy_backend", TOKEN, ["--token-delay-ms", "1"]));
  proxy = await spawnServer("proxy", PROXY_ENTRY, proxyArgs());
});

afterAll(async () => {
  await proxy?.kill();
  await backend?.kill();
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

const control = (op: Op, body: object) => controlRequest(nats.nc, { deployment: DEPLOYMENT, kind: "model", instance: "policy_model", token: TOKEN }, op, body);
const phase = (id: string, extra: object = {}) => controlPhase(id, extra, 20);
const admin = (path: string, body?: object) => backendAdmin(backend.url, path, body);
const status = async (): Promise<any> => (await fetch(`${proxy!.url}/ng-capture/v1/status`, { headers: { authorization: `Bearer ${TOKEN}` } })).json();
const client = (key: string) => new OpenAI({ baseURL: `${proxy!.url}/ng-rollout/${key}/v1`, apiKey: "unused", maxRetries: 0, timeout: 20_000 });

const TOOLS = [{ type: "function" as const, function: { name: "calculator", parameters: { type: "object", properties: { expression: { type: "string" } } } } }];
const FIRST = [
  { role: "system" as const, content: "calculator agent" },
  { role: "user" as const, content: "Compute: 6 * 7" },
];

describe("restored generation cut", () => {
  it("is not consumed by a re-issued call whose conversation differs, and is consumed by the matching one", async () => {
    const openai = client("rc");
    const first = await openai.chat.completions.create({ model: "policy", messages: FIRST, tools: TOOLS });
    const toolCall = first.choices[0]!.message.tool_calls![0]!;
    const second = [...FIRST, { role: "assistant" as const, content: null, tool_calls: [toolCall] }, { role: "tool" as const, tool_call_id: toolCall.id, content: '{"result":"42"}' }];
    await admin("/admin/hold", { after: 1 });
    const lost = openai.chat.completions.create({ model: "policy", messages: second, tools: TOOLS }).catch((error: unknown) => error);
    await waitUntil(async () => (await admin("/admin/calls")).calls.length === 2, "the in-flight call at the backend");

    const prepared = await control("prepare", phase("c-rc"));
    expect(prepared.report.counts).toMatchObject({ inflight: 1, cut: 1, cut_failed: 0 });
    createCheckpointDir(root, "c-rc"); // as the coordinator does before any commit
    const commit = await control("commit", phase("c-rc", { checkpoint_dir: join(root, "c-rc"), episode_ids: [{ rollout_id: "rc", attempt: 0 }] }));
    expect(commit.episode_ids).toEqual(["rc"]);
    await control("resume", phase("c-rc"));
    const [delivered, inflight] = (await admin("/admin/calls")).calls;

    // The proxy dies; a fresh one restores the checkpoint (breaking the dead owner's ledger locks).
    await proxy!.kill();
    proxy = undefined;
    await admin("/admin/release", {});
    expect(await lost).toBeInstanceOf(Error);
    proxy = await spawnServer("proxy-2", PROXY_ENTRY, proxyArgs());
    expect(await control("restore", phase("c-rc", { checkpoint_dir: join(root, "c-rc"), episode_ids: [{ rollout_id: "rc", attempt: 0 }] }))).toMatchObject({ restored: ["rc-a1"] });
    await control("resume", phase("c-rc"));
    expect((await status()).restored_generation_cuts).toBe(1);

    // A different conversation regenerates: no continuation, and the cut stays restored.
    const replacement = client("rc-a1");
    const other = [...second.slice(0, 3), { role: "tool" as const, tool_call_id: toolCall.id, content: '{"result":"41"}' }];
    expect((await replacement.chat.completions.create({ model: "policy", messages: other, tools: TOOLS })).choices[0]!.message.content).toBe("41");
    let calls = (await admin("/admin/calls")).calls;
    expect(calls).toHaveLength(3);
    expect([calls[2].capture_key, calls[2].continued_from, calls[2].continued_prefix_tokens, calls[2].parent_call_id]).toEqual(["rc-a1", null, 0, delivered.model_call_id]);
    expect((await status()).restored_generation_cuts).toBe(1);

    // The re-issued call with the cut's conversation continues after the staged prefix.
    expect((await replacement.chat.completions.create({ model: "policy", messages: second, tools: TOOLS, temperature: 0.5 })).choices[0]!.message.content).toBe("42");
    calls = (await admin("/admin/calls")).calls;
    expect([calls[3].capture_key, calls[3].continued_from]).toEqual(["rc-a1", inflight.model_call_id]);
    expect((await status()).restored_generation_cuts).toBe(0);
    // Stripe lock files (beside them the owner file they are hard links to).
    expect((await readdir(join(root, "ledger", "locks"))).filter((name) => name.startsWith("stripe-")).length).toBeLessThanOrEqual(16);
  });
});

describe("restoring the same checkpoint twice, for an episode that had made no model call", () => {
  it("does not root the new replacement's lineage at the dead replacement's calls", async () => {
    const scope = { checkpoint_dir: join(root, "c-tw"), episode_ids: [{ rollout_id: "tw", attempt: 0 }] };
    createCheckpointDir(root, "c-tw"); // as the coordinator does before any commit
    const chat = async () => (await client("tw-a1").chat.completions.create({ model: "policy", messages: FIRST, tools: TOOLS })).id;
    const callsOfReplacement = async () => ((await admin("/admin/calls")).calls as any[]).filter((c) => c.capture_key === "tw-a1");
    const restartAndRestore = async (name: string) => {
      await proxy!.kill("SIGKILL");
      proxy = await spawnServer(name, PROXY_ENTRY, proxyArgs());
      expect(await control("restore", phase("c-tw", scope))).toMatchObject({ phase: "restored" });
      await control("resume", phase("c-tw"));
    };
    // The checkpoint is taken before rollout tw made its first model call.
    expect((await control("prepare", phase("c-tw"))).phase).toBe("prepared");
    expect(await control("commit", phase("c-tw", scope))).toMatchObject({ phase: "committed" });
    await control("resume", phase("c-tw"));

    // Crash: a fresh proxy restores tw as tw-a1, whose replacement makes one call, then crashes too.
    await restartAndRestore("proxy-tw-1");
    await chat();
    const [dead] = await callsOfReplacement();
    expect(dead.parent_call_id).toBeNull();

    // The same checkpoint is restored again: the new replacement starts where tw was at the checkpoint.
    await restartAndRestore("proxy-tw-2");
    await chat();
    const calls = await callsOfReplacement();
    expect(calls).toHaveLength(2);
    expect(calls[1].parent_call_id, `the dead replacement's call ${dead.model_call_id} is not its parent`).toBeNull();
    const ledger = (await (await fetch(`${proxy!.url}/ng-capture/v1/ledger/tw-a1`, { headers: { authorization: `Bearer ${TOKEN}` } })).json()) as { records: { model_call_id: string }[] };
    expect(ledger.records.map((r) => r.model_call_id)).toEqual([calls[1].model_call_id]);
  });
});
