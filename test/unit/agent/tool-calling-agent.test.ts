import { afterEach, describe, expect, it, vi } from "vitest";
import { recordingDriver } from "../../support/recording-driver.js";
import {
  LoopStateSchema,
  MAX_LOOP_MESSAGES,
  MAX_SEED_MESSAGES,
  runTurnLoop,
  seededState,
  type ChatMessage,
  type LoopDriver,
  type LoopState,
} from "../../../participants/gym/agent-server/tool-calling-agent.js";
import { refusalCode } from "../../support/refusal.js";

afterEach(() => vi.unstubAllGlobals());

/** A policy that makes `rounds` tool rounds of `callsPerRound` calculator calls, then answers "2". */
function stubPolicy(rounds: number, callsPerRound = 1): void {
  let policyCalls = 0;
  vi.stubGlobal("fetch", async (url: string) => {
    if (String(url).includes("/v1/chat/completions")) {
      policyCalls += 1;
      const tool_calls = Array.from({ length: callsPerRound }, (_, i) => ({
        id: `c${policyCalls}.${i}`,
        type: "function",
        function: { name: "calculator", arguments: '{"expression":"1+1"}' },
      }));
      const message = policyCalls <= rounds ? { role: "assistant", content: null, tool_calls } : { role: "assistant", content: "2" };
      return new Response(JSON.stringify({ choices: [{ message }] }), { status: 200 });
    }
    return new Response(JSON.stringify({ result: 2 }), { status: 200 });
  });
}


const endpoints = { policyUrl: "http://p", resourcesUrl: "http://r", stream: false };
const longestSeed: ChatMessage[] = Array.from({ length: MAX_SEED_MESSAGES }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: `m${i}` }));

describe("tool-calling agent turn loop", () => {
  it("a longest seed with the most tool rounds records only boundaries its own restore accepts", async () => {
    stubPolicy(8);
    const boundaries: LoopState[] = [];
    const result = await runTurnLoop(endpoints, "r1.a1", { expression: "1+1", tool_rounds: 8 }, null, seededState(longestSeed), recordingDriver(boundaries));
    expect(result.answer).toBe("2");
    expect(boundaries.map((b) => b.messages.length)).toEqual([61, 63, 65, 67, 69, 71, 73, 75, 77, 78]);
    for (const b of boundaries) expect(LoopStateSchema.safeParse(b).success).toBe(true);
    // Every boundary, the final one included, says which leading messages came from the seed.
    expect(boundaries.map((b) => b.seeded)).toEqual(Array(10).fill(1 + MAX_SEED_MESSAGES));
  });

  it("counts answered policy calls: a call refused admission_closed, parked and sent again is one", async () => {
    let refused = false;
    vi.stubGlobal("fetch", async (url: string) => {
      if (!String(url).includes("/v1/chat/completions")) return new Response(JSON.stringify({ result: 2 }), { status: 200 });
      if (!refused) {
        refused = true;
        return new Response(JSON.stringify({ error: { code: "admission_closed", detail: "a checkpoint is open" } }), { status: 409 });
      }
      return new Response(JSON.stringify({ choices: [{ message: { role: "assistant", content: "2" } }] }), { status: 200 });
    });
    let parks = 0;
    const driver = { ...recordingDriver([]), park: async () => void parks++ };
    const result = await runTurnLoop(endpoints, "r1.a1", { expression: "1+1", tool_rounds: 1 }, null, seededState([{ role: "user", content: "hi" }]), driver);
    expect([result.answer, result.modelCalls, parks]).toEqual(["2", 1, 1]);
  });

  it("a state that outgrows the restore limit fails when recorded, never as a boundary", async () => {
    // Ten parallel calls per round: 61 + 11 per round passes 128 after the seventh round.
    stubPolicy(16, 10);
    const boundaries: LoopState[] = [];
    const run = runTurnLoop(endpoints, "r1.a1", { expression: "1+1", tool_rounds: 8 }, null, seededState(longestSeed), recordingDriver(boundaries));
    expect(await refusalCode(run)).toBe("internal_error");
    expect(boundaries.length).toBeGreaterThan(0);
    for (const b of boundaries) {
      expect(b.messages.length).toBeLessThanOrEqual(MAX_LOOP_MESSAGES);
      expect(LoopStateSchema.safeParse(b).success).toBe(true);
    }
  });
});

describe("tool-calling agent streamed policy replies", () => {
  const streaming = { ...endpoints, stream: true };
  const sse = (...chunks: unknown[]) => [...chunks.map((c) => `data: ${typeof c === "string" ? c : JSON.stringify(c)}\n\n`), "data: [DONE]\n\n"].join("");

  /** A policy answering every call with `body` as an SSE stream; counts the calculator calls. */
  function streamPolicy(body: string): { toolCalls: number } {
    const seen = { toolCalls: 0 };
    vi.stubGlobal("fetch", async (url: string) => {
      if (String(url).includes("/v1/chat/completions")) return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
      seen.toolCalls += 1;
      return new Response(JSON.stringify({ result: 2 }), { status: 200 });
    });
    return seen;
  }
  const run = () => runTurnLoop(streaming, "r1.a1", { expression: "1+1", tool_rounds: 1 }, null, seededState([{ role: "user", content: "hi" }]), recordingDriver([]));

  it("assembles a well-formed streamed answer", async () => {
    streamPolicy(sse({ choices: [{ delta: { role: "assistant", content: "" } }] }, { choices: [{ delta: { content: "2" } }] }, { choices: [{ delta: {}, finish_reason: "stop" }], usage: { total_tokens: 3 } }));
    expect((await run()).answer).toBe("2");
  });

  it("refuses a chunk whose content is not a string (internal_error), as a non-streamed reply is, instead of answering ''", async () => {
    streamPolicy(sse({ choices: [{ delta: { content: 42 } }] }));
    expect(await refusalCode(run())).toBe("internal_error");
  });

  it("refuses a tool call whose name is not a string instead of calling a tool named '[object Object]'", async () => {
    const seen = streamPolicy(sse({ choices: [{ delta: { tool_calls: [{ index: 0, id: "c1", function: { name: { n: 1 }, arguments: '{"expression":"1+1"}' } }] } }] }));
    expect(await refusalCode(run())).toBe("internal_error");
    expect(seen.toolCalls).toBe(0);
  });

  it("refuses a chunk that is not JSON with a catalog code (internal_error), not a bare SyntaxError", async () => {
    streamPolicy(sse("{not json"));
    expect(await refusalCode(run())).toBe("internal_error");
  });
});

describe("tool-calling agent policy calls whose connection fails", () => {
  /** The policy's calls: each entry answers one call (an Error is thrown as fetch's network error). */
  function scriptedPolicy(answers: (Response | Error)[]): { calls: () => number } {
    let calls = 0;
    vi.stubGlobal("fetch", async (url: string) => {
      if (!String(url).includes("/v1/chat/completions")) return new Response(JSON.stringify({ result: 2 }), { status: 200 });
      const answer = answers[Math.min(calls++, answers.length - 1)]!;
      if (answer instanceof Error) throw answer;
      return answer.clone();
    });
    return { calls: () => calls };
  }
  // As undici throws it: its SocketError carries the code (a cause without one is a call fetch refused to make).
  const cut = () => new TypeError("terminated", { cause: Object.assign(new Error("other side closed"), { code: "UND_ERR_SOCKET" }) });
  const answered = () => new Response(JSON.stringify({ choices: [{ message: { role: "assistant", content: "2" } }] }), { status: 200 });
  const run = (driver: LoopDriver = recordingDriver([])) =>
    runTurnLoop(endpoints, "r1.a1", { expression: "1+1", tool_rounds: 1 }, null, seededState([{ role: "user", content: "hi" }]), driver);

  it("sends a call cut off before its reply was complete again (it left no ledger row), counting it once", async () => {
    const policy = scriptedPolicy([cut(), answered()]);
    const result = await run();
    expect([result.answer, result.modelCalls, policy.calls()]).toEqual(["2", 1, 2]);
  });

  it("passes on the refusal the call sent again gets: storage_error once the model proxy's ledger disk is full", async () => {
    const full = new Response(JSON.stringify({ error: { code: "storage_error", detail: "ENOSPC" } }), { status: 507 });
    const policy = scriptedPolicy([cut(), full]);
    expect(await refusalCode(run())).toBe("storage_error");
    expect(policy.calls()).toBe(2);
  });

  it("gives up after two calls sent again, with upstream_failed", async () => {
    const policy = scriptedPolicy([cut()]);
    expect(await refusalCode(run())).toBe("upstream_failed");
    expect(policy.calls()).toBe(3);
  });

  it("sends nothing again once its episode is aborted (a retire) while it waits to", async () => {
    const policy = scriptedPolicy([cut(), answered()]);
    const abort = new AbortController();
    const run1 = run({ ...recordingDriver([]), signal: abort.signal }).catch((e: unknown) => e);
    await vi.waitFor(() => expect(policy.calls()).toBe(1));
    abort.abort(new Error("retired"));
    expect(await run1).toMatchObject({ message: "retired" });
    expect(policy.calls()).toBe(1);
  });
});
