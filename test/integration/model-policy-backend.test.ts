import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildInventory } from "../../participants/kinds/model/generation-cut-contract.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { BACKEND_ENTRY, commonArgs, spawnServer, type SpawnedServer } from "../e2e/model-processes.js";
import { waitUntil } from "../support/wait-until.js";
import { backendAdmin } from "../support/policy-backend-admin.js";

const TOKEN = "backend-secret";
let nats: NatsFixture;
let backend: SpawnedServer;

beforeAll(async () => {
  nats = await startNats();
  backend = await spawnServer("policy-backend", BACKEND_ENTRY, commonArgs(nats.server.url, "bk", "policy_backend", TOKEN, ["--token-delay-ms", "1"]));
});

afterAll(async () => {
  await backend?.kill();
  await nats?.close();
});

const TOOLS = [{ type: "function", function: { name: "calculator", parameters: { type: "object" } } }];
const first = [
  { role: "system", content: "sys" },
  { role: "user", content: "Compute: 17 + 25" },
];
const second = [...first, { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "calculator", arguments: "{}" } }] }, { role: "tool", tool_call_id: "call_1", content: '{"result":"42"}' }];

async function chat(body: object, headers: Record<string, string> = {}): Promise<Response> {
  return fetch(`${backend.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
}
const admin = (path: string, body?: object) => backendAdmin(backend.url, path, body);

describe("reference policy backend", () => {
  it("answers tool calls then the tool result, non-streaming and streaming, and records every call", async () => {
    await admin("/admin/reset", {});
    const toolCall: any = await (await chat({ model: "policy", messages: first, tools: TOOLS, metadata: { tool_rounds: "1" } }, { "x-ng-capture-key": "r1", "x-ng-model-call-id": "mc-1" })).json();
    expect(toolCall.choices[0].message.tool_calls[0].function).toEqual({ name: "calculator", arguments: '{"expression":"17 + 25"}' });
    expect(toolCall.choices[0].finish_reason).toBe("tool_calls");
    const streamed = await chat({ model: "policy", messages: second, tools: TOOLS, stream: true }, { "x-ng-capture-key": "r1", "x-ng-model-call-id": "mc-2", "x-ng-continued-from": "mc-0" });
    expect(streamed.headers.get("content-type")).toContain("text/event-stream");
    expect(streamed.headers.get("x-ng-staging-key")).toBe("stage/mc-2");
    const text = await streamed.text();
    const content = text
      .split("\n")
      .filter((l) => l.startsWith("data: {"))
      .map((l) => JSON.parse(l.slice(6)).choices[0].delta.content ?? "")
      .join("");
    expect(content).toBe("42");
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    await waitUntil(async () => (await admin("/admin/calls")).calls[1]?.delivered === true, "delivery");
    const { calls } = await admin("/admin/calls");
    expect(calls.map((c: any) => [c.seq, c.capture_key, c.model_call_id, c.message_count, c.stream, c.continued_from, c.delivered])).toEqual([
      [1, "r1", "mc-1", 2, false, null, true],
      [2, "r1", "mc-2", 4, true, "mc-0", true],
    ]);
  });

  it("holds calls beyond the Nth until released, and cuts a held call with a valid receipt", async () => {
    await admin("/admin/reset", {});
    await admin("/admin/hold", { after: 0 });
    const pending = chat({ messages: first, tools: TOOLS }, { "x-ng-capture-key": "r2-a1", "x-ng-model-call-id": "mc-held" });
    await waitUntil(async () => (await admin("/admin/calls")).calls.length === 1, "the held call");
    const inventory = buildInventory("ck1", "policy_model", [{ ticket_id: "t1", rollout_id: "r2", attempt: 1, model_call_id: "mc-held", admitted_at: 1 }]);
    const unauthorized = await fetch(`${backend.url}/ng-control/v1/generation-cut`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(inventory) });
    expect(unauthorized.status).toBe(401);
    const cut = await fetch(`${backend.url}/ng-control/v1/generation-cut`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify(inventory),
    });
    const receipt: any = await cut.json();
    expect(receipt.inventory).toEqual(inventory);
    expect(receipt.prefixes).toHaveLength(1);
    expect(receipt.prefixes[0]).toMatchObject({ ticket_id: "t1", disposition: "durable_prefix", cut_kind: "active_prefix", prefix_token_count: 0 });
    const tampered = await fetch(`${backend.url}/ng-control/v1/generation-cut`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({ ...inventory, inventory_digest: "0".repeat(64) }),
    });
    expect(tampered.status).toBe(400);
    expect((await admin("/admin/calls")).calls[0].delivered).toBe(false);
    await admin("/admin/release", {});
    expect(((await (await pending).json()) as any).choices[0].message.tool_calls).toHaveLength(1);
    expect((await admin("/admin/cuts")).cuts.map((c: any) => c.model_call_ids)).toEqual([["mc-held"]]);
  });

  it("refuses malformed chat bodies with invalid_request", async () => {
    const response = await chat({ messages: [] });
    expect(response.status).toBe(400);
    expect(((await response.json()) as any).error.code).toBe("invalid_request");
  });
});
