import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { buildInventory, inventoryDigest, validateReceipt, type GenerationCutInventory } from "../../../participants/kinds/model/index.js";

const sha = (text: string) => createHash("sha256").update(text).digest("hex");
const prefix = (ticket_id: string, extra: object = {}) => ({ ticket_id, rollout_id: "r1", attempt: 0, model_call_id: `mc-${ticket_id}`, admitted_at: 1700000000.5, ...extra });

function durable(p: ReturnType<typeof prefix>, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    ...p,
    disposition: "durable_prefix",
    cut_kind: "active_prefix",
    frozen_buffer_id: `buf-${p.ticket_id}`,
    staging_keys: [`stage/${p.ticket_id}`],
    prefix_token_count: 12,
    prefix_digest: "0123456789abcdef".repeat(4),
    effective_output_limit: 4084,
    ...extra,
  };
}

function receipt(inventory: GenerationCutInventory, prefixes: unknown[], extra: object = {}): Record<string, unknown> {
  return { checkpoint_id: inventory.checkpoint_id, cut_id: "cut-1", inventory_digest: inventory.inventory_digest, backend_snapshot_id: "snap-1", inventory, prefixes, ...extra };
}

describe("generation-cut inventory", () => {
  it("sorts prefixes by ticket id and digests the canonical JSON of {checkpoint_id, server_name, active_prefixes}", () => {
    const inventory = buildInventory("ck-1", "policy_model", [prefix("t2"), prefix("t1")]);
    expect(inventory.active_prefixes.map((p) => p.ticket_id)).toEqual(["t1", "t2"]);
    const canonical =
      '{"active_prefixes":[' +
      '{"admitted_at":1700000000.5,"attempt":0,"model_call_id":"mc-t1","rollout_id":"r1","ticket_id":"t1"},' +
      '{"admitted_at":1700000000.5,"attempt":0,"model_call_id":"mc-t2","rollout_id":"r1","ticket_id":"t2"}' +
      '],"checkpoint_id":"ck-1","server_name":"policy_model"}';
    expect(inventory.inventory_digest).toBe(sha(canonical));
    expect(inventoryDigest({ server_name: "policy_model", active_prefixes: inventory.active_prefixes, checkpoint_id: "ck-1" })).toBe(sha(canonical));
    expect(buildInventory("ck-2", "policy_model", [prefix("t1"), prefix("t2")]).inventory_digest).not.toBe(inventory.inventory_digest);
  });
});

describe("receipt validation (exact echo)", () => {
  const inventory = buildInventory("ck-1", "policy_model", [prefix("t1"), prefix("t2")]);
  const [p1, p2] = inventory.active_prefixes as [ReturnType<typeof prefix>, ReturnType<typeof prefix>];

  it("accepts an exact echo with one ack per ticket (any key order, any ack order)", () => {
    const reordered = { server_name: inventory.server_name, inventory_digest: inventory.inventory_digest, active_prefixes: inventory.active_prefixes, checkpoint_id: inventory.checkpoint_id };
    const ok = validateReceipt(inventory, receipt(reordered as GenerationCutInventory, [{ ...p2, disposition: "durable_failure" }, durable(p1)]));
    expect(ok.prefixes.map((a) => [a.ticket_id, a.disposition])).toEqual([
      ["t2", "durable_failure"],
      ["t1", "durable_prefix"],
    ]);
  });

  it("refuses a tampered echo, a different digest or another checkpoint", () => {
    const acks = [durable(p1), durable(p2)];
    expect(() => validateReceipt(inventory, receipt({ ...inventory, server_name: "other" }, acks))).toThrow(/exact echo/);
    expect(() => validateReceipt(inventory, receipt({ ...inventory, active_prefixes: [p1] }, acks))).toThrow(/exact echo/);
    expect(() => validateReceipt(inventory, receipt({ ...inventory, active_prefixes: [p1, { ...p2, admitted_at: 1 }] }, acks))).toThrow(/exact echo/);
    expect(() => validateReceipt(inventory, receipt(inventory, acks, { inventory_digest: "f".repeat(64) }))).toThrow(/inventory_digest/);
    expect(() => validateReceipt(inventory, receipt(inventory, acks, { checkpoint_id: "ck-2" }))).toThrow(/another checkpoint/);
    expect(() => validateReceipt(inventory, receipt(inventory, acks, { extra: 1 }))).toThrow(/malformed/);
  });

  it("requires exactly one ack per ticket", () => {
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1)]))).toThrow(/1 acks for 2 tickets/);
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1), durable(p1)]))).toThrow(/t1 twice/);
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1), durable(prefix("t3"))]))).toThrow(/unknown ticket t3/);
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1), durable(p2), durable(p2)]))).toThrow(/3 acks for 2 tickets/);
  });

  it.each([
    ["rollout_id", "r9"],
    ["attempt", 1],
    ["model_call_id", "mc-x"],
    ["admitted_at", 1700000001],
  ])("refuses an ack whose %s differs from its ticket", (field, value) => {
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1), { ...durable(p2), [field]: value }]))).toThrow(/identity of ticket t2/);
  });

  it.each(["cut_kind", "frozen_buffer_id", "staging_keys", "prefix_token_count", "prefix_digest", "effective_output_limit"])("a durable_prefix ack requires %s", (field) => {
    const ack = durable(p2);
    delete ack[field];
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1), ack]))).toThrow(/malformed/);
  });

  it.each([
    ["staging_keys", { staging_keys: ["k"] }],
    ["cut_kind", { cut_kind: "active_prefix" }],
    ["prefix_digest", { prefix_digest: "a".repeat(64) }],
  ])("a durable_failure ack may not carry %s", (_field, extra) => {
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1), { ...p2, disposition: "durable_failure", ...extra }]))).toThrow(/malformed/);
  });

  it.each([
    ["empty staging_keys", { staging_keys: [] }],
    ["duplicate staging_keys", { staging_keys: ["k", "k"] }],
    ["a short prefix_digest", { prefix_digest: "abc" }],
    ["an upper-case prefix_digest", { prefix_digest: "A".repeat(64) }],
    ["effective_output_limit 0", { effective_output_limit: 0 }],
    ["a negative prefix_token_count", { prefix_token_count: -1 }],
    ["an unknown cut_kind", { cut_kind: "partial" }],
    ["a stop reason without a finish reason", { terminal_stop_reason: "eos" }],
    ["an unknown finish reason", { terminal_finish_reason: "tool_calls" }],
    ["an unknown disposition", { disposition: "maybe" }],
  ])("refuses a durable_prefix ack with %s", (_what, extra) => {
    expect(() => validateReceipt(inventory, receipt(inventory, [durable(p1), durable(p2, extra)]))).toThrow(/malformed/);
  });

  it("accepts terminal completions with a finish reason and a stop reason", () => {
    const ok = validateReceipt(
      inventory,
      receipt(inventory, [durable(p1, { cut_kind: "terminal_completion", terminal_finish_reason: "stop", terminal_stop_reason: "</s>" }), durable(p2, { terminal_finish_reason: "length" })]),
    );
    expect(ok.prefixes.map((a) => (a.disposition === "durable_prefix" ? a.terminal_finish_reason : null))).toEqual(["stop", "length"]);
  });
});
