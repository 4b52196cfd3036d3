import { describe, expect, it } from "vitest";
import { sha256Hex } from "../../../protocol/index.js";
import { buildInventory } from "../../../participants/kinds/model/generation-cut-contract.js";
import { createPolicyBackend } from "../../../participants/gym/policy-backend/policy-backend.js";

const MESSAGES = [
  { role: "system", content: "sys" },
  { role: "user", content: "Compute: 17 + 25" },
];

/**
 * The call log, the cut log and the duplicate-cut receipts grew for the life of the process (each
 * call kept its emitted text, up to 1 MB). They keep the latest entries up to their limits now, and
 * a call's prefix digest is computed as it is emitted instead of from a kept copy of the text.
 */
describe("reference policy backend logs are bounded", () => {
  it("keeps the latest calls up to the limit, numbering on; a hold without `after` holds from the last seq", async () => {
    const { app, controls } = await createPolicyBackend({ cutToken: "cut-token", callLogLimit: 10 });
    const chat = (key: string, id: string) =>
      app.inject({ method: "POST", url: "/v1/chat/completions", headers: { "x-ng-capture-key": key, "x-ng-model-call-id": id }, payload: { messages: MESSAGES } });
    try {
      for (let i = 1; i <= 25; i++) expect((await chat(`r${i}`, `mc-${i}`)).statusCode).toBe(200);
      const body = (await app.inject({ method: "GET", url: "/admin/calls" })).json();
      expect(body.calls.length).toBeLessThanOrEqual(10);
      expect(body.calls.at(-1)).toMatchObject({ seq: 25, model_call_id: "mc-25" });
      expect(body.calls_dropped).toBe(25 - body.calls.length);
      expect(controls.calls.every((c) => !("emitted" in c))).toBe(true); // no copy of the text is kept
      expect((await app.inject({ method: "POST", url: "/admin/hold", payload: {} })).json()).toEqual({ hold_after: 25 });
      await app.inject({ method: "POST", url: "/admin/release", payload: {} });

      // A retained call is still cut with the digest of its emitted text.
      const inventory = buildInventory("ck1", "policy_model", [{ ticket_id: "t1", rollout_id: "r25", attempt: 0, model_call_id: "mc-25", admitted_at: 1 }]);
      const cut = await app.inject({ method: "POST", url: "/ng-control/v1/generation-cut", headers: { authorization: "Bearer cut-token" }, payload: inventory });
      expect(cut.statusCode).toBe(200);
      const [ack] = cut.json().prefixes;
      // The policy is deterministic: the same messages get the same tokens.
      const message = (await chat("r-x", "mc-x")).json().choices[0].message;
      const text = message.content ?? message.tool_calls[0].function.arguments;
      expect(text.length).toBeGreaterThan(0);
      expect(ack).toMatchObject({ disposition: "durable_prefix", prefix_digest: sha256Hex(text) });
    } finally {
      await app.close();
    }
  });

  it("keeps the latest cut receipts and cut log entries up to the limit", async () => {
    const { app, controls } = await createPolicyBackend({ cutToken: "cut-token", receiptLimit: 3 });
    const cut = (i: number) =>
      app.inject({ method: "POST", url: "/ng-control/v1/generation-cut", headers: { authorization: "Bearer cut-token" }, payload: buildInventory(`ck${i}`, "policy_model", []) });
    try {
      const first: string[] = [];
      for (let i = 1; i <= 8; i++) first.push((await cut(i)).json().cut_id);
      expect(controls.cuts.length).toBeLessThanOrEqual(3);
      expect(controls.cuts.at(-1)?.checkpoint_id).toBe("ck8");
      // A duplicate of a recent cut gets its receipt again; one of an evicted cut is cut afresh.
      expect((await cut(8)).json().cut_id).toBe(first[7]);
      expect((await cut(1)).json().cut_id).not.toBe(first[0]);
    } finally {
      await app.close();
    }
  });
});
