import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { pino } from "pino";
import { SKIP_CATEGORIES } from "../../../participants/kinds/model/index.js";
import { CheckpointError } from "../../../protocol/index.js";
import { CHAT, chat, deliveredCall, isPending, modelFixture, settle, type ModelFixture } from "./model-fixtures.js";

let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture();
});
afterEach(async () => {
  await f.close();
});

const codeOf = async (promise: Promise<unknown>) => {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(CheckpointError);
  return (error as CheckpointError).code;
};

describe("admission tickets", () => {
  it("are keyed by the capture key and carry its episode, route, stream flag and a fresh model call id", async () => {
    const first = await f.kind.admit("roll-1-a2", CHAT, chat("hi", { stream: true }));
    const second = await f.kind.admit("roll-1", "/v1/responses", { input: "x" });
    expect(first.captureKey).toBe("roll-1-a2");
    expect(first.episode).toEqual({ rollout_id: "roll-1", attempt: 2 });
    expect(second.episode).toEqual({ rollout_id: "roll-1", attempt: 0 });
    expect([first.route, first.stream, second.route, second.stream]).toEqual([CHAT, true, "/v1/responses", false]);
    expect(first.modelCallId).toMatch(/^mc-[0-9a-f-]{36}$/);
    expect(first.modelCallId).not.toBe(second.modelCallId);
    expect(first.ticketId).not.toBe(second.ticketId);
    expect([first.parentCallId, first.responseStarted, first.held, first.finished, first.claimedCut]).toEqual([null, false, false, false, null]);
    expect(f.kind.readiness().counts.inflight).toBe(2);
  });

  it("refuses a path component that is not a capture key with rollout_id_required", async () => {
    expect(await codeOf(f.kind.admit("bad key/..", CHAT, chat("hi")))).toBe("rollout_id_required");
    expect(f.kind.tickets.size).toBe(0);
  });

  it("closed admission refuses new calls with admission_closed and opens no ticket", async () => {
    await f.kind.closeAdmission();
    expect(f.kind.admissionOpen).toBe(false);
    expect(await codeOf(f.kind.admit("r1", CHAT, chat("hi")))).toBe("admission_closed");
    expect(f.kind.readiness().counts.inflight).toBe(0);
    await f.kind.openAdmission();
    expect((await f.kind.admit("r1", CHAT, chat("hi"))).captureKey).toBe("r1");
  });

  it("retired attempts get stale_attempt, checked before the admission gate", async () => {
    f.retired.add("r1#0");
    expect(await codeOf(f.kind.admit("r1", CHAT, chat("hi")))).toBe("stale_attempt");
    await f.kind.closeAdmission();
    expect(await codeOf(f.kind.admit("r1", CHAT, chat("hi")))).toBe("stale_attempt");
    expect(await codeOf(f.kind.admit("r1-a1", CHAT, chat("hi")))).toBe("admission_closed");
    expect(f.kind.tickets.size).toBe(0);
  });

  it("an attempt being retired gets stale_attempt while its in-flight calls are stopped", async () => {
    const ticket = await f.kind.admit("r2", CHAT, chat("hi"));
    const retiring = f.kind.retire([{ rollout_id: "r2", attempt: 0 }]);
    expect(ticket.abort.signal.aborted).toBe(true);
    expect(await codeOf(f.kind.admit("r2", CHAT, chat("again")))).toBe("stale_attempt");
    const pending = isPending(retiring);
    await settle();
    expect(pending()).toBe(true); // retire waits for the stopped call to close
    f.kind.fail(ticket);
    await retiring;
    expect(f.kind.tickets.size).toBe(0);
  });

  it("resolve the parent call from the key's ledger: first call null, then the last delivered call", async () => {
    const a = await deliveredCall(f.kind, "chain");
    const b = await deliveredCall(f.kind, "chain");
    const failed = await f.kind.admit("chain", CHAT, chat("x"));
    f.kind.fail(failed);
    const c = await f.kind.admit("chain", CHAT, chat("y"));
    expect([a.parentCallId, b.parentCallId, failed.parentCallId, c.parentCallId]).toEqual([null, a.modelCallId, b.modelCallId, b.modelCallId]);
    expect((await f.kind.captureManifest("chain")).records.map((r) => [r.model_call_id, r.parent_call_id])).toEqual([
      [a.modelCallId, null],
      [b.modelCallId, a.modelCallId],
    ]);
  });
});

describe("parents", () => {
  it("a recorded call whose response is still leaving is not a parent: its caller may leave and the row be taken back", async () => {
    const first = await deliveredCall(f.kind, "p1", "one");
    const leaving = await f.kind.admit("p1", CHAT, chat("two"));
    await f.kind.responseStart(leaving);
    await f.kind.record(leaving, { stagingKey: null, usage: null });
    // A retry (or a parallel call) admitted now descends from the last call that surely left.
    const retry = await f.kind.admit("p1", CHAT, chat("two"));
    expect(retry.parentCallId).toBe(first.modelCallId);
    await f.kind.undelivered(leaving);
    expect((await f.kind.ledger.rows("p1")).map((r) => r.model_call_id)).toEqual([first.modelCallId]);
    await f.kind.responseStart(retry);
    await f.kind.complete(retry, { stagingKey: null, usage: null });
    expect((await f.kind.admit("p1", CHAT, chat("three"))).parentCallId).toBe(retry.modelCallId);
  });
});

describe("held responses and readiness", () => {
  it("a response whose start is intercepted while admission is closed is held until reopen", async () => {
    const ticket = await f.kind.admit("h1", CHAT, chat("hi", { stream: true }));
    await f.kind.closeAdmission();
    const start = f.kind.responseStart(ticket);
    const pending = isPending(start);
    await settle();
    expect(pending()).toBe(true);
    expect(ticket.held).toBe(true);
    expect(f.kind.readiness()).toEqual({ blockers: [], counts: { inflight: 1, held: 1, cut: 1, cut_failed: 0, cut_skipped: 0 }, restarts: [] });
    await f.kind.openAdmission();
    await start;
    expect([ticket.held, ticket.responseStarted]).toEqual([false, true]);
    expect(f.kind.readiness().blockers).toEqual(["h1"]);
    expect(f.kind.readiness().counts).toMatchObject({ inflight: 1, held: 0 });
  });

  it("stopAdmitting (shutdown) refuses held responses, later held ones and new calls with admission_closed; started ones go on", async () => {
    const streaming = await f.kind.admit("s1", CHAT, chat("hi", { stream: true }));
    await f.kind.responseStart(streaming);
    const held = await f.kind.admit("h1", CHAT, chat("hi", { stream: true }));
    const later = await f.kind.admit("h2", CHAT, chat("hi", { stream: true }));
    await f.kind.closeAdmission();
    const start = f.kind.responseStart(held);
    await settle();
    expect(held.held).toBe(true);
    f.kind.stopAdmitting();
    expect(await codeOf(start)).toBe("admission_closed");
    expect(await codeOf(f.kind.responseStart(later))).toBe("admission_closed");
    expect(await codeOf(f.kind.admit("n1", CHAT, chat("hi")))).toBe("admission_closed");
    // Not reopened by a resume either: the participant is stopping (and /health says so).
    await f.kind.openAdmission();
    expect(await codeOf(f.kind.admit("n1", CHAT, chat("hi")))).toBe("admission_closed");
    expect(f.kind.admissionOpen).toBe(false);
    expect([held.held, streaming.responseStarted]).toEqual([false, true]);
    expect(f.kind.readiness().counts).toMatchObject({ held: 0 });
  });

  it("only responses already streaming block prepare; held and undelivered calls never do", async () => {
    const streaming = await f.kind.admit("s1", CHAT, chat("a", { stream: true }));
    await f.kind.responseStart(streaming);
    await f.kind.admit("u1", CHAT, chat("b")); // undelivered: the backend is still generating
    const late = await f.kind.admit("held1", CHAT, chat("c"));
    await f.kind.closeAdmission();
    void f.kind.responseStart(late);
    await settle();
    const readiness = f.kind.readiness();
    expect(readiness.blockers).toEqual(["s1"]);
    expect(readiness.counts).toMatchObject({ inflight: 3, held: 1 });
    await f.kind.complete(streaming, { stagingKey: null, usage: null });
    expect(f.kind.readiness().blockers).toEqual([]);
    await f.kind.openAdmission();
  });

  it("closing admission never waits for a generation to finish", async () => {
    await f.kind.admit("g1", CHAT, chat("a"));
    const started = await f.kind.admit("g2", CHAT, chat("b"));
    await f.kind.responseStart(started);
    // Both generations are still open; close resolves anyway.
    await f.kind.closeAdmission();
    expect(f.kind.admissionOpen).toBe(false);
    expect(f.kind.tickets.size).toBe(2);
    await f.kind.openAdmission();
  });

  it("a held response of a retired attempt is released with stale_attempt and writes no row", async () => {
    const ticket = await f.kind.admit("h2", CHAT, chat("hi"));
    await f.kind.closeAdmission();
    const start = f.kind.responseStart(ticket).then(
      () => "started",
      (e: CheckpointError) => e.code,
    );
    await settle();
    expect(ticket.held).toBe(true);
    const retiring = f.kind.retire([{ rollout_id: "h2", attempt: 0 }]);
    expect(await start).toBe("stale_attempt");
    f.kind.fail(ticket);
    await retiring;
    expect(f.kind.readiness().counts).toMatchObject({ inflight: 0, held: 0 });
    expect((await f.kind.captureManifest("h2")).records).toEqual([]);
  });

  it("counts inflight, held, cut, cut_failed and cut_skipped (with reasons) per close", async () => {
    await f.kind.admit("c1", CHAT, chat("a"));
    await f.kind.admit("c2", CHAT, chat("b", { tool_choice: "required" }));
    await f.kind.admit("c3", CHAT, chat("c", { guided_regex: "[0-9]+" }));
    const failing = await f.kind.admit("c4", CHAT, chat("d"));
    f.answer = (tickets) => {
      const acks = new Map();
      for (const t of tickets) if (t.ticketId !== failing.ticketId) acks.set(t.ticketId, { ...ackOf(t) });
      return { acks, failed: tickets.length - acks.size, error: null };
    };
    await f.kind.closeAdmission();
    expect(f.kind.readiness().counts).toEqual({
      inflight: 4,
      held: 0,
      cut: 1,
      cut_failed: 1,
      cut_skipped: 2,
      "cut_skipped.tool_choice": 1,
      "cut_skipped.guided_regex": 1,
    });
    await f.kind.openAdmission();
    // Counts are per round: the next close starts from zero.
    f.answer = (tickets) => ({ acks: new Map(), failed: tickets.length, error: "timeout" });
    await f.kind.closeAdmission();
    expect(f.kind.readiness().counts).toMatchObject({ cut: 0, cut_failed: 2, cut_skipped: 2 });
  });

  it("counts skips under fixed names whatever the request says; the detailed reasons go to the log", async () => {
    const lines: Record<string, unknown>[] = [];
    const g = await modelFixture({ logger: pino({}, { write: (s: string) => lines.push(JSON.parse(s) as Record<string, unknown>) }) });
    try {
      for (let i = 0; i < 5; i++) await g.kind.admit(`t${i}`, CHAT, chat("x", { tool_choice: `caller-value-${i}` }));
      await g.kind.admit("f1", CHAT, chat("x", { response_format: { type: "made_up_format" } }));
      await g.kind.admit("f2", CHAT, chat("x", { response_format: { type: "json_schema", json_schema: {} } }));
      await g.kind.admit("s1", CHAT, chat("x", { structured_outputs: { choice: ["a"] } }));
      await g.kind.closeAdmission();
      expect(g.kind.readiness().counts).toEqual({
        inflight: 8,
        held: 0,
        cut: 0,
        cut_failed: 0,
        cut_skipped: 8,
        "cut_skipped.tool_choice": 5,
        "cut_skipped.response_format": 2,
        "cut_skipped.structured_outputs": 1,
      });
      for (const name of Object.keys(g.kind.readiness().counts).filter((n) => n.startsWith("cut_skipped."))) {
        expect(SKIP_CATEGORIES).toContain(name.slice("cut_skipped.".length));
      }
      expect(lines.find((l) => l.msg === "generation cut skipped")?.reasons).toEqual({
        "tool_choice:caller-value-0": 1,
        "tool_choice:caller-value-1": 1,
        "tool_choice:caller-value-2": 1,
        "tool_choice:caller-value-3": 1,
        "tool_choice:caller-value-4": 1,
        "response_format:made_up_format": 1,
        "response_format:json_schema": 1,
        structured_outputs: 1,
      });
    } finally {
      await g.close();
    }
  });
});

function ackOf(t: import("../../../participants/kinds/model/index.js").AdmissionTicket) {
  return {
    ticket_id: t.ticketId,
    rollout_id: t.episode.rollout_id,
    attempt: t.episode.attempt,
    model_call_id: t.modelCallId,
    admitted_at: t.admittedAt,
    disposition: "durable_prefix" as const,
    cut_kind: "active_prefix" as const,
    frozen_buffer_id: "b",
    staging_keys: ["k"],
    prefix_token_count: 1,
    prefix_digest: "b".repeat(64),
    effective_output_limit: 5,
  };
}
