import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { MAX_CONTINUATION_HEADER_BYTES, ModelKind, conversationDigest, continuationOf, type GenerationCutRecord, type ModelRecord } from "../../../participants/kinds/model/index.js";
import { BACKEND, CHAT, ackFor, chat, cutRecord, deliveredCall, emptyRecords, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";
import { MAX_JSON_DEPTH, canonicalDigest, encodeMessage } from "../../../protocol/index.js";

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture();
});
afterEach(async () => {
  vi.useRealTimers();
  await f.close();
});

describe("the cut round at close-admission", () => {
  it("inventories only undelivered, unconstrained calls and keeps a record per episode", async () => {
    const started = await f.kind.admit("a", CHAT, chat("s"));
    await f.kind.responseStart(started);
    const free = await f.kind.admit("b", CHAT, chat("free", { tool_choice: "auto", response_format: { type: "text" } }));
    await f.kind.admit("c", CHAT, chat("named", { tool_choice: { type: "function", function: { name: "f" } } }));
    await f.kind.admit("d", CHAT, chat("json", { response_format: { type: "json_schema", json_schema: {} } }));
    await f.kind.admit("e", CHAT, chat("tag", { structural_tag: { begin: "<x>" } }));
    await f.kind.closeAdmission();
    expect(f.rounds).toEqual([[free.ticketId]]);
    expect(free.cutAck?.staging_keys).toEqual([`cut/${free.modelCallId}`]);
    expect(f.kind.readiness().counts).toMatchObject({
      cut: 1,
      cut_skipped: 3,
      "cut_skipped.tool_choice": 1,
      "cut_skipped.response_format": 1,
      "cut_skipped.structural_tag": 1,
    });
    const [record] = await f.kind.exportRecords([ep("b")]);
    expect(record!.generation_cuts).toEqual([
      {
        model_call_id: free.modelCallId,
        request_digest: conversationDigest(CHAT, chat("free")),
        continuation: {
          source_capture_key: "b",
          source_model_call_id: free.modelCallId,
          staging_keys: [`cut/${free.modelCallId}`],
          prefix_token_count: 7,
          prefix_digest: "a".repeat(64),
          effective_output_limit: 100,
          terminal_finish_reason: null,
          terminal_stop_reason: null,
        },
      },
    ]);
    expect(await f.kind.exportRecords([ep("c"), ep("d"), ep("e")])).toEqual(emptyRecords(ep("c"), ep("d"), ep("e")));
    await f.kind.openAdmission();
    expect(free.cutAck).toBeNull();
  });

  it("structured output on the Responses and Messages routes is constrained too: never sent to the cut round", async () => {
    const free = await f.kind.admit("r", "/v1/responses", { input: "x", text: { format: { type: "text" } } });
    await f.kind.admit("s", "/v1/responses", { input: "x", text: { format: { type: "json_schema", name: "answer", schema: {} } } });
    await f.kind.admit("m", "/v1/messages", { messages: [], output_format: { type: "json_schema", schema: {} } });
    await f.kind.closeAdmission();
    expect(f.rounds).toEqual([[free.ticketId]]);
    expect(f.kind.readiness().counts).toMatchObject({ cut: 1, cut_skipped: 2, "cut_skipped.text.format": 1, "cut_skipped.output_format": 1 });
  });

  it("without a known backend nothing is sent and every undelivered call is skipped as backend:unknown", async () => {
    const g = await modelFixture({ cuts: false });
    try {
      await g.kind.admit("x", CHAT, chat("a"));
      await g.kind.closeAdmission();
      expect(g.rounds).toEqual([]);
      expect(g.kind.readiness().counts).toMatchObject({ cut: 0, cut_skipped: 1, "cut_skipped.backend:unknown": 1 });
      expect(g.kind.statusExtras()).toMatchObject({ cuts_enabled: false });
    } finally {
      await g.close();
    }
  });

  it("a failed round never blocks: every call counts as cut_failed and no cut is exported", async () => {
    await f.kind.admit("x", CHAT, chat("a"));
    await f.kind.admit("y", CHAT, chat("b"));
    f.answer = (tickets) => ({ acks: new Map(), failed: tickets.length, error: "generation-cut answered HTTP 500" });
    await f.kind.closeAdmission();
    expect(f.kind.readiness().counts).toMatchObject({ cut: 0, cut_failed: 2 });
    expect(await f.kind.exportRecords([ep("x"), ep("y")])).toEqual(emptyRecords(ep("x"), ep("y")));
  });

  it("a call whose cut record cannot be made (a conversation nested past MAX_JSON_DEPTH) counts as cut_failed; the close still succeeds", async () => {
    let deep: unknown = "x";
    for (let i = 0; i <= MAX_JSON_DEPTH; i++) deep = [deep];
    const ok = await f.kind.admit("fine", CHAT, chat("a"));
    await f.kind.admit("deep", CHAT, { model: "policy", messages: [{ role: "user", content: "a", blob: deep }] });
    await f.kind.closeAdmission();
    expect(f.kind.readiness().counts).toMatchObject({ cut: 1, cut_failed: 1 });
    const records = await f.kind.exportRecords([ep("fine"), ep("deep")]);
    expect(records.map((r) => [r.episode_id.rollout_id, r.generation_cuts.map((c) => c.model_call_id)])).toEqual([
      ["fine", [ok.modelCallId]],
      ["deep", []],
    ]);
  });

  it("an ack whose continuation would not fit the x-ng-continuation header limit counts as cut_failed: no cut kept (the call is regenerated)", async () => {
    const ok = await f.kind.admit("fits", CHAT, chat("a"));
    const big = await f.kind.admit("big", CHAT, chat("b"));
    // 30 staging keys of 500 characters: a header of about 20 KiB, past the 16 KiB of headers a Node (or h11) backend accepts.
    const keys = Array.from({ length: 30 }, (_, i) => `${i}-${"k".repeat(496)}`);
    f.answer = (tickets) => ({ acks: new Map(tickets.map((t) => [t.ticketId, ackFor(t, t === big ? { staging_keys: keys } : {})])), failed: 0, error: null });
    await f.kind.closeAdmission();
    expect(f.kind.readiness().counts).toMatchObject({ cut: 1, cut_failed: 1 });
    const records = await f.kind.exportRecords([ep("fits"), ep("big")]);
    expect(records.map((r) => [r.episode_id.rollout_id, r.generation_cuts.map((c) => c.model_call_id)])).toEqual([
      ["fits", [ok.modelCallId]],
      ["big", []],
    ]);
  });

  it("keeps one cut per episode: the latest admitted call", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(1_700_000_000_000);
    const older = await f.kind.admit("retry", CHAT, chat("q"));
    vi.setSystemTime(1_700_000_005_000);
    const newer = await f.kind.admit("retry", CHAT, chat("q"));
    vi.setSystemTime(1_700_000_002_000);
    const middle = await f.kind.admit("retry", CHAT, chat("q"));
    expect([older.admittedAt, newer.admittedAt, middle.admittedAt]).toEqual([1_700_000_000, 1_700_000_005, 1_700_000_002]);
    await f.kind.closeAdmission();
    expect(f.kind.readiness().counts).toMatchObject({ cut: 3 });
    const records = await f.kind.exportRecords([ep("retry")]);
    expect(records).toHaveLength(1);
    expect(records[0]!.generation_cuts.map((c) => c.model_call_id)).toEqual([newer.modelCallId]);
  });

  it("is bounded by the closing op's deadline (less a reserve for its reply), not only by the cut timeout", async () => {
    await f.kind.admit("d1", CHAT, chat("a"));
    await f.kind.closeAdmission();
    await f.kind.openAdmission();
    await f.kind.closeAdmission({ timeLeftMs: 60_000 });
    await f.kind.openAdmission();
    await f.kind.closeAdmission({ timeLeftMs: 500 });
    expect(f.backends.map((b) => b.timeoutMs).slice(0, 2)).toEqual([BACKEND.timeoutMs, BACKEND.timeoutMs]);
    expect(f.backends[2]!.timeoutMs).toBeLessThanOrEqual(400);
    expect(f.backends[2]!.timeoutMs).toBeGreaterThan(300);
    await f.kind.openAdmission();
    // No time left at all: nothing is sent, and the calls count as cut_failed (regenerated after a restore).
    await f.kind.closeAdmission({ timeLeftMs: 0 });
    expect(f.rounds).toHaveLength(3);
    expect(f.kind.readiness().counts).toMatchObject({ cut: 0, cut_failed: 1 });
  });

  it("a hung cut endpoint holds close-admission only until the deadline's budget, not for the cut timeout", async () => {
    const hung = createServer(() => undefined); // accepts, never answers
    await new Promise<void>((resolve) => hung.listen(0, "127.0.0.1", resolve));
    const g = new ModelKind({
      ledgerDir: join(f.dir, "ledger-hung"),
      cutBackend: { root: `http://127.0.0.1:${(hung.address() as AddressInfo).port}`, token: "t", timeoutMs: 600_000, serverName: "policy_model" },
    });
    try {
      await g.admit("hung", CHAT, chat("a"));
      const started = Date.now();
      await g.closeAdmission({ timeLeftMs: 400 });
      expect(Date.now() - started).toBeLessThan(5_000);
      expect(g.readiness().counts).toMatchObject({ cut: 0, cut_failed: 1 });
    } finally {
      hung.closeAllConnections();
      await new Promise((resolve) => hung.close(resolve));
      await g.close();
    }
  });

  it("lists every staging key of rows and cuts, sorted and unique, in the commit extras", async () => {
    await deliveredCall(f.kind, "k1", "a", "stage/z");
    await deliveredCall(f.kind, "k1", "b", "stage/a");
    await deliveredCall(f.kind, "k2", "c", null);
    const undelivered = await f.kind.admit("k2", CHAT, chat("d"));
    f.answer = (tickets) => ({ acks: new Map(tickets.map((t) => [t.ticketId, ackFor(t, { staging_keys: ["stage/m", "stage/a"] })])), failed: 0, error: null });
    await f.kind.closeAdmission();
    const records = await f.kind.exportRecords([ep("k1"), ep("k2"), ep("k1")]);
    expect(records.map((r) => [r.episode_id.rollout_id, r.rows.length, r.generation_cuts.length])).toEqual([
      ["k1", 2, 0],
      ["k2", 1, 1],
    ]);
    expect(records[1]!.rows.map((r) => r.model_call_id)).not.toContain(undelivered.modelCallId);
    expect(f.kind.commitExtras(records)).toEqual({ staging_keys: ["stage/a", "stage/m", "stage/z"] });
  });

  it("past the reply budget, the commit extras carry the staging keys' count and digest (the keys stay in the records)", () => {
    // 500 rollouts × 40 delivered calls: one key each, far past what one NATS message may carry.
    const rows = Array.from({ length: 40 }, (_, i) => ({ staging_key: `stage/${"x".repeat(20)}/${i}` }));
    const records = Array.from({ length: 500 }, (_, r) => ({
      episode_id: { rollout_id: `r${r}`, attempt: 0 },
      rows: rows.map((row, i) => ({ ...row, staging_key: `${row.staging_key}/${r}`, model_call_id: `mc-${r}-${i}` })),
      generation_cuts: [],
    })) as unknown as ModelRecord[];
    const keys = records.flatMap((rec) => rec.rows.map((row) => row.staging_key!)).sort();
    const extras = f.kind.commitExtras(records);
    expect(extras).toEqual({ staging_keys: null, staging_key_count: 20_000, staging_keys_sha256: canonicalDigest(keys) });
    expect(encodeMessage(extras).length).toBeLessThan(1024);
  });

  it("measures the staging keys as encoded: keys JSON escapes (a cut backend's control characters) cannot carry a list past one NATS message", () => {
    // 400 keys of ~500 raw bytes (~200 KiB, under the budget) that encode to 6 bytes a character (~1.2 MiB).
    const records = Array.from({ length: 400 }, (_, r) => ({
      episode_id: { rollout_id: `r${r}`, attempt: 0 },
      rows: [{ staging_key: `${"\u0001".repeat(500)}${r}`, model_call_id: `mc-${r}` }],
      generation_cuts: [],
    })) as unknown as ModelRecord[];
    const keys = records.map((rec) => rec.rows[0]!.staging_key!).sort();
    const extras = f.kind.commitExtras(records);
    expect(extras).toEqual({ staging_keys: null, staging_key_count: 400, staging_keys_sha256: canonicalDigest(keys) });
    expect(() => encodeMessage(extras)).not.toThrow();
  });
});

describe("restored cuts", () => {
  const source = ep("rc");
  const record = (cut: GenerationCutRecord | null): ModelRecord => ({ episode_id: source, rows: [], generation_cuts: cut ? [cut] : [] });

  it("are keyed by the next attempt and consumed only by a call whose conversation digest matches", async () => {
    await f.kind.install([record(cutRecord("rc", chat("the question")))], {});
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    // The source attempt never consumes it.
    const onSource = await f.kind.admit("rc", CHAT, chat("the question"));
    expect(onSource.claimedCut).toBeNull();
    // A different conversation regenerates and leaves the cut in place.
    const mismatch = await f.kind.admit("rc-a1", CHAT, chat("another question"));
    expect(mismatch.claimedCut).toBeNull();
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    // A constrained request with the same conversation is never continued.
    const constrained = await f.kind.admit("rc-a1", CHAT, chat("the question", { tool_choice: "required" }));
    expect(constrained.claimedCut).toBeNull();
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    // The unconsumed cut is still exported for the next attempt.
    expect((await f.kind.exportRecords([ep("rc", 1)]))[0]!.generation_cuts.map((c) => c.model_call_id)).toEqual(["mc-cut"]);
    // Different sampling parameters, same conversation: consumed.
    const match = await f.kind.admit("rc-a1", CHAT, chat("the question", { temperature: 0.7, stream: true }));
    expect(match.claimedCut?.model_call_id).toBe("mc-cut");
    expect(continuationOf(match)).toMatchObject({ source_capture_key: "rc", staging_keys: ["cut/mc-cut"], prefix_token_count: 9 });
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
    const again = await f.kind.admit("rc-a1", CHAT, chat("the question"));
    expect(again.claimedCut).toBeNull();
    // The delivered continuation's row names the cut call it continued.
    await f.kind.responseStart(match);
    await f.kind.complete(match, { stagingKey: "stage/x", usage: null });
    expect((await f.kind.captureManifest("rc-a1")).records.map((r) => r.continued_from)).toEqual(["mc-cut"]);
  });

  it("a claiming call that fails before its response starts gives the cut back", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q")))], {});
    const claimed = await f.kind.admit("rc-a1", CHAT, chat("q"));
    expect(claimed.claimedCut).not.toBeNull();
    f.kind.fail(claimed);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    const retry = await f.kind.admit("rc-a1", CHAT, chat("q"));
    expect(retry.claimedCut?.model_call_id).toBe("mc-cut");
  });

  it("a claiming call that fails after its response started (a stream cut mid-way) gives the cut back", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q")))], {});
    const claimed = await f.kind.admit("rc-a1", CHAT, chat("q"));
    await f.kind.responseStart(claimed);
    f.kind.fail(claimed);
    // No row was written: the saved prefix is not spent, exported again and continued by the re-issued call.
    expect(await f.kind.ledger.rows("rc-a1")).toEqual([]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    expect((await f.kind.exportRecords([ep("rc", 1)])).map((r) => r.generation_cuts.map((c) => c.model_call_id))).toEqual([["mc-cut"]]);
    expect((await f.kind.admit("rc-a1", CHAT, chat("q"))).claimedCut?.model_call_id).toBe("mc-cut");
  });

  it("a claiming call whose row is taken back (its caller left before the answer had left) gives the cut back", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q")))], {});
    const claimed = await f.kind.admit("rc-a1", CHAT, chat("q"));
    expect(claimed.claimedCut?.model_call_id).toBe("mc-cut");
    await f.kind.responseStart(claimed);
    await f.kind.record(claimed, { stagingKey: null, usage: null });
    await f.kind.undelivered(claimed);
    expect(await f.kind.ledger.rows("rc-a1")).toEqual([]);
    // The saved prefix is not spent: exported again, and the re-issued call continues from it.
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    expect((await f.kind.exportRecords([ep("rc", 1)])).map((r) => r.generation_cuts.map((c) => c.model_call_id))).toEqual([["mc-cut"]]);
    const retry = await f.kind.admit("rc-a1", CHAT, chat("q"));
    expect(retry.claimedCut?.model_call_id).toBe("mc-cut");
  });

  it("a consumed cut stays in the next checkpoint while its call is undelivered, unless that call was cut anew", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q")))], {});
    const claimed = await f.kind.admit("rc-a1", CHAT, chat("q"));
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
    // The cut round fails: the export still carries the consumed cut (and its staging keys).
    f.answer = (tickets) => ({ acks: new Map(), failed: tickets.length, error: "timeout" });
    await f.kind.closeAdmission();
    let records = await f.kind.exportRecords([ep("rc", 1)]);
    expect(records.map((r) => r.generation_cuts.map((c) => c.model_call_id))).toEqual([["mc-cut"]]);
    expect(f.kind.commitExtras(records)).toEqual({ staging_keys: ["cut/mc-cut"] });
    await f.kind.openAdmission();
    // A round that cuts the continuing call exports its newer cut instead.
    f.answer = (tickets) => ({ acks: new Map(tickets.map((t) => [t.ticketId, ackFor(t)])), failed: 0, error: null });
    await f.kind.closeAdmission();
    records = await f.kind.exportRecords([ep("rc", 1)]);
    expect(records.map((r) => r.generation_cuts.map((c) => c.model_call_id))).toEqual([[claimed.modelCallId]]);
    await f.kind.openAdmission();
    // Delivered: the cut is spent and leaves the checkpoint.
    await f.kind.responseStart(claimed);
    await f.kind.complete(claimed, { stagingKey: "stage/x", usage: null });
    records = await f.kind.exportRecords([ep("rc", 1)]);
    expect(records.map((r) => r.generation_cuts)).toEqual([[]]);
  });

  it("a consumed cut whose call is skipped by the round (cuts off) stays in the checkpoint", async () => {
    const g = await modelFixture({ cuts: false });
    try {
      await g.kind.install([record(cutRecord("rc", chat("q")))], {});
      await g.kind.admit("rc-a1", CHAT, chat("q"));
      await g.kind.closeAdmission();
      expect(g.kind.readiness().counts).toMatchObject({ cut_skipped: 1 });
      expect((await g.kind.exportRecords([ep("rc", 1)])).map((r) => r.generation_cuts.map((c) => c.model_call_id))).toEqual([["mc-cut"]]);
    } finally {
      await g.close();
    }
  });

  it("an upstream that refuses the claiming call (non-2xx) gives the cut back", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q")))], {});
    const claimed = await f.kind.admit("rc-a1", CHAT, chat("q"));
    await f.kind.responseStart(claimed); // the refusal's head passes through to the caller
    f.kind.fail(claimed);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    expect((await f.kind.admit("rc-a1", CHAT, chat("q"))).claimedCut?.model_call_id).toBe("mc-cut");
  });

  it("retire and forget drop restored cuts; a commit whose scope leaves them out frees them", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q"))), { episode_id: ep("other"), rows: [], generation_cuts: [cutRecord("other", chat("q"))] }], {});
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 2 });
    await f.kind.retire([ep("rc", 1)]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    await f.kind.afterCommit([ep("zzz")]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
  });

  it("a cut given back after a commit whose scope left its episode out is freed by that commit's clean-up", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q")))], {});
    const claimed = await f.kind.admit("rc-a1", CHAT, chat("q"));
    // The claimed cut is exported while its call is held (its round failed); this commit's scope continues rc-a1.
    f.answer = (tickets) => ({ acks: new Map(), failed: tickets.length, error: "timeout" });
    await f.kind.closeAdmission();
    expect((await f.kind.exportRecords([ep("rc", 1)])).map((r) => r.generation_cuts.map((c) => c.model_call_id))).toEqual([["mc-cut"]]);
    await f.kind.afterCommit([ep("rc", 1)]);
    await f.kind.openAdmission();
    // The call fails after the resume: its cut is given back.
    f.kind.fail(claimed);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    // In scope, the next commit keeps it (the re-issued call continues from it).
    await f.kind.afterCommit([ep("rc", 1)]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    // A commit whose scope leaves rc-a1 out frees it, as it frees an unclaimed restored cut.
    await f.kind.afterCommit([ep("zzz")]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
  });

  it("a retire of a later attempt drops the restored state of every attempt it retires", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q")))], {}); // restored as rc-a1
    expect(f.kind.hasLiveState()).toBe(true);
    await f.kind.retire([ep("rc", 2)]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it("forget drops restored keys as well as restored cuts", async () => {
    await f.kind.install([record(cutRecord("rc", chat("q"))), { episode_id: ep("kept"), rows: [], generation_cuts: [cutRecord("kept", chat("q"))] }], {});
    await f.kind.forget(["rc"]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    await f.kind.forget(["kept"]);
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it("restore refuses a cut that names another source and changes nothing", async () => {
    await expect(f.kind.install([record(cutRecord("rc-a3", chat("q")))], {})).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it(`restore refuses a cut whose x-ng-continuation header would pass ${MAX_CONTINUATION_HEADER_BYTES} bytes and changes nothing`, async () => {
    const keys = Array.from({ length: 30 }, (_, i) => `${i}-${"k".repeat(496)}`);
    await expect(f.kind.install([record(cutRecord("rc", chat("q"), { staging_keys: keys }))], {})).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    expect(f.kind.statusExtras()).toMatchObject({ restored_generation_cuts: 0 });
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it("restore refuses a record with more than one cut", async () => {
    const two = { episode_id: source, rows: [], generation_cuts: [cutRecord("rc", chat("q")), cutRecord("rc", chat("r"))] } as ModelRecord;
    await expect(f.kind.install([two], {})).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it("the cut backend's root drops a trailing /v1", async () => {
    const { backendRoot } = await import("../../../participants/kinds/model/index.js");
    expect(backendRoot("http://h:8000/v1/")).toBe("http://h:8000");
    expect(backendRoot("http://h:8000/openai/v1")).toBe("http://h:8000/openai");
    expect(backendRoot(BACKEND.root)).toBe("http://backend.invalid");
  });
});
