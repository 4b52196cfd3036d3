import { mkdtemp, rm } from "node:fs/promises";
import type { Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { FastifyInstance } from "fastify";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import type { BackendControls } from "../../participants/gym/policy-backend/backend-controls.js";
import { createPolicyBackend } from "../../participants/gym/policy-backend/policy-backend.js";
import { ModelKind, runCutRound } from "../../participants/kinds/model/index.js";
import { ep } from "../support/episode.js";
import { listenLocal, postStreamedChat } from "../support/attach-proxy-fixture.js";
import { waitUntil } from "../support/wait-until.js";

// The attach proxy in front of the reference policy backend, both in process: a call whose answer the
// backend finished writing after admission closed (the proxy holds it) is still undelivered to its
// caller, so the cut round must preserve it (its whole completion), not count it as cut_failed.
const CUT_TOKEN = "cut-secret";
let dir: string;
let backend: FastifyInstance;
let controls: BackendControls;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
/** Runs inside closeAdmission, after admission closed and before the cut request is sent. */
let beforeCut: (() => Promise<void>) | undefined;
/** The model participant's log lines. */
let lines: Record<string, unknown>[];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-held-cut-"));
  ({ app: backend, controls } = await createPolicyBackend({ cutToken: CUT_TOKEN }));
  const backendUrl = await backend.listen({ host: "127.0.0.1", port: 0 });
  beforeCut = undefined;
  lines = [];
  kind = new ModelKind({
    logger: pino({}, { write: (line: string) => lines.push(JSON.parse(line) as Record<string, unknown>) }),
    ledgerDir: join(dir, "ledger"),
    cutBackend: { root: backendUrl, token: CUT_TOKEN, timeoutMs: 10_000, serverName: "policy_model" },
    cutRunner: async (...args) => {
      await beforeCut?.();
      return runCutRound(...args);
    },
  });
  proxy = createAttachProxy({ upstream: parseUpstream(`${backendUrl}/v1`), kind, controlToken: "t" });
  proxyUrl = await listenLocal(proxy);
});

afterEach(async () => {
  proxy.closeAllConnections();
  await new Promise((resolve) => proxy.close(resolve));
  await backend.close();
  await kind.close();
  await rm(dir, { recursive: true, force: true });
});

describe("generation cut of a response the model proxy holds", () => {
  it("a call the backend finished after admission closed is cut whole (terminal_completion), not cut_failed", async () => {
    // The call reaches the backend, which holds it before its response starts.
    controls.setHold(0);
    const caller = postStreamedChat(proxyUrl, "held-1");
    caller.catch(() => undefined); // awaited below; a failed assertion first must not leave it unhandled
    await waitUntil(() => controls.calls.length === 1, "the call at the backend");
    const [call] = controls.calls;
    // Between admission closing and the cut request, the backend writes the whole answer to the proxy,
    // which holds it: in the reference Gym (tokens without delay) this happens on most timer checkpoints.
    beforeCut = async () => {
      controls.releaseHold();
      await waitUntil(() => call!.delivered, "the backend to finish writing the answer");
      await waitUntil(() => kind.readiness().counts.held === 1, "the proxy to hold the response");
    };
    await kind.closeAdmission();
    expect(kind.readiness().counts).toMatchObject({ inflight: 1, held: 1, cut: 1, cut_failed: 0 });
    expect(controls.cuts.map((c) => c.dispositions)).toEqual([["durable_prefix"]]);
    const [record] = await kind.exportRecords([ep("held-1")]);
    expect(record!.rows).toEqual([]);
    expect(record!.generation_cuts).toHaveLength(1);
    expect(record!.generation_cuts[0]!.model_call_id).toBe(call!.model_call_id);
    expect(record!.generation_cuts[0]!.continuation).toMatchObject({ prefix_token_count: call!.tokens_emitted, terminal_finish_reason: "stop" });
    // Reopened, the held answer reaches its caller as usual.
    await kind.openAdmission();
    const answer = await caller;
    expect(answer.status).toBe(200);
    expect(answer.body.trimEnd().endsWith("data: [DONE]")).toBe(true);
    await waitUntil(async () => (await kind.ledger.rows("held-1")).length === 1, "the delivered call's row");
    expect(lines.filter((l) => String(l.msg).startsWith("generation cut"))).toEqual([]);
  });

  it("a call the backend refuses to cut counts as cut_failed, and the log says so with the backend's reason", async () => {
    controls.setCutMode("failure");
    controls.setHold(0);
    const caller = postStreamedChat(proxyUrl, "refused-1");
    caller.catch(() => undefined);
    await waitUntil(() => controls.calls.length === 1, "the call at the backend");
    await kind.closeAdmission();
    expect(kind.readiness().counts).toMatchObject({ cut: 0, cut_failed: 1 });
    expect(lines.filter((l) => String(l.msg).startsWith("generation cut"))).toEqual([
      expect.objectContaining({ level: 40, calls: 1, reasons: { "scripted cut failure": 1 }, msg: "generation cut refused by the backend for some calls; they will be regenerated" }),
    ]);
    controls.releaseHold();
    await kind.openAdmission();
    expect((await caller).status).toBe(200);
  });
});
