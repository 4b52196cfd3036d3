import { createServer, type ServerResponse } from "node:http";
import { once } from "node:events";
import type { AddressInfo } from "node:net";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import Fastify, { type FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createResourcesApp, declarationsOf } from "../../../participants/kinds/resources/index.js";
import {
  CodeVerifier,
  CohortCompareVerifier,
  CompetitiveProgrammingVerifier,
  EquivalenceJudgeVerifier,
  JudgeClient,
  MathVerifier,
  modelCohortJudge,
  normalizeAnswer,
  type CohortJudge,
  type VerifierServer,
} from "../../../participants/verifiers/index.js";
import { waitUntil } from "../../support/wait-until.js";
import { resourcesWorld } from "./resources-world.js";

/** A tiny OpenAI-compatible judge stub: answers by a rule on the last user message. */
let stub: FastifyInstance;
let stubUrl: string;
const stubCalls: string[] = [];
let stubMode: "ok" | "fail" | "garbage" = "ok";

beforeAll(async () => {
  stub = Fastify();
  stub.post("/v1/chat/completions", async (request, reply) => {
    const body = request.body as { messages: { role: string; content: string }[] };
    const last = body.messages.at(-1)!.content;
    stubCalls.push(last);
    if (stubMode === "fail") return reply.code(500).send({ error: "down" });
    let content = "maybe";
    if (stubMode === "ok") {
      if (last.includes("Responses:")) content = `BEST: ${/\[(\d+)\] best/.exec(last)?.[1] ?? "0"}`;
      else {
        const ref = /Reference answer: (.*)\n/.exec(last)?.[1];
        const cand = /Candidate answer: (.*)$/.exec(last)?.[1];
        content = ref !== undefined && cand !== undefined && ref.replace(/\s/g, "") === cand.replace(/\s/g, "") ? "YES" : "NO";
      }
    }
    return { id: "x", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content }, finish_reason: "stop" }] };
  });
  stubUrl = await stub.listen({ host: "127.0.0.1", port: 0 });
});

afterAll(async () => {
  await stub?.close();
});

async function post(server: VerifierServer, key: string, payload: object) {
  const { app } = await createResourcesApp(server);
  try {
    const reply = await app.inject({ method: "POST", url: `/ng-rollout/${key}/verify`, payload });
    return { status: reply.statusCode, body: reply.json() };
  } finally {
    await app.close();
  }
}

describe("declarations", () => {
  it("every reference verifier is stateless + replay", () => {
    const judge = new JudgeClient({ baseUrl: "http://127.0.0.1:9" });
    const servers = [
      new MathVerifier(),
      new CodeVerifier(),
      new CompetitiveProgrammingVerifier(),
      new EquivalenceJudgeVerifier(judge),
      new CohortCompareVerifier({ size: 2 }, modelCohortJudge(judge)),
    ];
    for (const server of servers) expect(declarationsOf(server)).toEqual({ mode: "stateless", verify: "replay" });
  });

  it("/close_session takes {} (or no body) and refuses anything else with invalid_request, as /seed_session does", async () => {
    const { app } = await createResourcesApp(new MathVerifier());
    try {
      const close = (payload: string) =>
        app.inject({ method: "POST", url: "/ng-rollout/r1/close_session", payload, headers: { "content-type": "application/json" } });
      for (const payload of ["{}", ""]) expect((await close(payload)).statusCode, payload).toBe(200);
      for (const payload of ['{"session":"s1"}', "[1,2]", '"x"']) {
        const reply = await close(payload);
        expect({ status: reply.statusCode, code: reply.json().error?.code }, payload).toEqual({ status: 400, code: "invalid_request" });
      }
    } finally {
      await app.close();
    }
  });
});

describe("math verifier", () => {
  it("compares normalized exact answers", async () => {
    expect(normalizeAnswer("The answer is \\boxed{\\frac{1}{2}}")).toBe("0.5");
    expect(normalizeAnswer(" 1,000. ")).toBe("1000");
    expect(normalizeAnswer("$42$")).toBe("42");
    expect(normalizeAnswer("4.50")).toBe("4.5");
    const task = { expected_answer: "1/2" };
    expect((await post(new MathVerifier(), "m1", { task, answer: "so \\boxed{0.5}" })).body).toEqual({ reward: 1, extracted: "0.5" });
    expect((await post(new MathVerifier(), "m1", { task, answer: "\\boxed{0.25}" })).body).toEqual({ reward: 0, extracted: "0.25" });
    expect((await post(new MathVerifier(), "m1", { task: {}, answer: "1" })).body.error.code).toBe("invalid_request");
  });

  it("compares integers exactly, however large, and other numbers to 12 significant digits", async () => {
    const factorial20 = { expected_answer: "2432902008176640000" };
    for (const answer of ["\\boxed{2432902008176640001}", "2432902008176640000.5", "2432902008176639999"]) {
      expect((await post(new MathVerifier(), "m2", { task: factorial20, answer })).body.reward, answer).toBe(0);
    }
    for (const answer of ["\\boxed{2,432,902,008,176,640,000}", "2.43290200817664e18", "\\frac{4865804016353280000}{2}", "2432902008176640000.0"]) {
      expect((await post(new MathVerifier(), "m2", { task: factorial20, answer })).body, answer).toEqual({ reward: 1, extracted: "2432902008176640000" });
    }
    expect(normalizeAnswer("-0012.50e1")).toBe("-125");
    expect(normalizeAnswer("1e-3")).toBe("0.001");
    expect(normalizeAnswer("1/3")).toBe(normalizeAnswer("0.333333333333333"));
  });
});

describe("deeply nested bodies", () => {
  const nested = (levels: number) => "[".repeat(levels) + "]".repeat(levels);
  const bodies = (levels: number) => ({
    math: `{"task":{"expected_answer":"1","x":${nested(levels)}},"answer":"1"}`,
    code: `{"task":{"function_name":"f","tests":[{"args":[],"expected":${nested(levels)}}]},"answer":"function f() {}"}`,
    cohort: `{"task":${nested(levels)},"answer":"a","_ng_group_id":"deep","_ng_rollout_index":0}`,
  });

  it("are refused with invalid_request instead of overflowing the stack (500)", async () => {
    const servers = {
      math: new MathVerifier(),
      code: new CodeVerifier(),
      cohort: new CohortCompareVerifier({ size: 2, collectionTimeoutMs: 1000 }, async (m) => m.map(() => 1)),
    };
    for (const [name, server] of Object.entries(servers)) {
      const { app } = await createResourcesApp(server);
      try {
        for (const levels of [2000, 200_000]) {
          const payload = bodies(levels)[name as keyof typeof servers];
          const reply = await app.inject({ method: "POST", url: "/ng-rollout/r1/verify", payload, headers: { "content-type": "application/json" } });
          expect([reply.statusCode, reply.json().error.code], `${name} at ${levels} levels`).toEqual([400, "invalid_request"]);
        }
      } finally {
        await app.close();
      }
    }
    // 128 levels in all (the body's object, the task's, then 126 arrays) are fine; one more is not.
    const { app } = await createResourcesApp(new MathVerifier());
    const send = (levels: number) => app.inject({ method: "POST", url: "/ng-rollout/r1/verify", payload: bodies(levels).math, headers: { "content-type": "application/json" } });
    expect((await send(126)).json()).toEqual({ reward: 1, extracted: "1" });
    expect((await send(127)).json().error.code).toBe("invalid_request");
    await app.close();
    // verify() called directly refuses them too.
    await expect(new MathVerifier().verify(JSON.parse(bodies(5000).math))).rejects.toMatchObject({ code: "invalid_request" });
  });
});

describe("equivalence judge", () => {
  it("refuses a judge URL fetch cannot call, instead of masking every sample judge_failed", () => {
    for (const baseUrl of ["localhost:8000", "judge.internal:8000", "ftp://judge/", "file:///tmp/"]) {
      expect(() => new JudgeClient({ baseUrl }), baseUrl).toThrow(/must be http:\/\/ or https:\/\//);
    }
    expect(() => new JudgeClient({ baseUrl: "not a url" })).toThrow();
    expect(() => new JudgeClient({ baseUrl: "https://judge.example/api/" })).not.toThrow();
  });

  it("asks the judge endpoint and maps YES/NO to rewards; failures are masked", async () => {
    const judge = new JudgeClient({ baseUrl: stubUrl, requestTimeoutMs: 5000 });
    const verifier = new EquivalenceJudgeVerifier(judge);
    const task = { question: "2+2?", expected_answer: "x + 1" };
    stubMode = "ok";
    expect((await post(verifier, "e1", { task, answer: "x+1" })).body).toEqual({ reward: 1, verdict: "YES" });
    expect((await post(verifier, "e1", { task, answer: "x+2" })).body).toEqual({ reward: 0, verdict: "NO" });
    expect(stubCalls.at(-1)).toContain("Question: 2+2?");
    stubMode = "garbage";
    expect((await post(verifier, "e1", { task, answer: "x+1" })).body).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed" });
    stubMode = "fail";
    expect((await post(verifier, "e1", { task, answer: "x+1" })).body).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed", detail: "judge answered HTTP 500" });
    stubMode = "ok";
    // Counted, not logged: the client keeps nothing per call.
    expect(judge.callCount).toBe(4);
    expect(Object.values(judge).filter((field) => Array.isArray(field))).toEqual([]);
  });
});

describe("equivalence judge: a reply without end", () => {
  it("is refused once past its cap (masked judge_failed) and the judge's stream is cancelled, instead of growing the process", async () => {
    let closed!: () => void;
    const cancelled = new Promise<void>((resolve) => (closed = resolve));
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    // Answers 200 and keeps writing whitespace (valid JSON padding) until the client goes away.
    const endless = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      res.on("close", closed);
      const pump = (): void => {
        while (!res.destroyed && res.write(chunk));
        if (!res.destroyed) res.once("drain", pump);
      };
      pump();
    }).listen(0, "127.0.0.1");
    await once(endless, "listening");
    try {
      const port = (endless.address() as AddressInfo).port;
      const verifier = new EquivalenceJudgeVerifier(new JudgeClient({ baseUrl: `http://127.0.0.1:${port}`, requestTimeoutMs: 60_000 }));
      const reply = await post(verifier, "e1", { task: { expected_answer: "1" }, answer: "1" });
      expect(reply.body).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed", detail: expect.stringMatching(/^judge: the reply passed \d+ bytes$/) });
      await cancelled;
    } finally {
      endless.closeAllConnections();
      endless.close();
    }
  });
});

describe("equivalence judge: retiring a request while the judge is asked", () => {
  it("aborts the judge call (stale_attempt), so the retire does not wait for the judge's request timeout", async () => {
    // A judge that accepts the request and never answers (a stuck inference server).
    const pending: ServerResponse[] = [];
    const judge = createServer((_req, res) => void pending.push(res)).listen(0, "127.0.0.1");
    await new Promise((resolve) => judge.once("listening", resolve));
    const world = await resourcesWorld();
    try {
      const port = (judge.address() as { port: number }).port;
      const a = await world.harness(new EquivalenceJudgeVerifier(new JudgeClient({ baseUrl: `http://127.0.0.1:${port}`, requestTimeoutMs: 60_000 })));
      const seed = await a.post("/ng-rollout/r1/seed_session", {});
      const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
      const verifying = a.post("/ng-rollout/r1/verify", { task: { expected_answer: "4" }, answer: "4" }, cookie);
      await waitUntil(() => pending.length === 1, "the judge request");
      const retire = await a.call("retire", { checkpoint_id: "x1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] } as never, 5).catch((error: unknown) => String(error));
      for (const res of pending) res.destroy();
      const reply = await verifying;
      expect({ retire, code: reply.json().error?.code }).toEqual({ retire: { retired: ["r1"] }, code: "stale_attempt" });
    } finally {
      await world.close();
      judge.closeAllConnections();
      judge.close();
    }
  });
});

/** A judge the cohort tests control: counts calls, resolves when told. */
function scriptedJudge() {
  const calls: number[][] = [];
  const judge: CohortJudge = async (members) => {
    calls.push(members.map((m) => m.index));
    return members.map((m) => (m.answer.includes("best") ? 1 : 0));
  };
  return { judge, calls };
}

const member = (group: string, index: number, answer: string, attempt?: number) => ({
  task: { prompt: "p" },
  answer,
  _ng_group_id: group,
  _ng_rollout_index: index,
  ...(attempt === undefined ? {} : { _ng_group_attempt: attempt }),
});

describe("cohort comparison verifier", () => {
  async function cohortApp(size: number, settings: object = {}, judge = scriptedJudge()) {
    const verifier = new CohortCompareVerifier({ size, collectionTimeoutMs: 10_000, ...settings }, judge.judge);
    const { app, kind } = await createResourcesApp(verifier);
    const send = (payload: object, key = "r") => app.inject({ method: "POST", url: `/ng-rollout/${key}/verify`, payload });
    return { verifier, app, kind, send, calls: judge.calls };
  }

  it("judges only after every member arrived and publishes all rewards together", async () => {
    const c = await cohortApp(3);
    let settled = 0;
    const first = c.send(member("g1", 0, "meh"), "r0").then((r) => (settled++, r));
    const second = c.send(member("g1", 2, "best one"), "r2").then((r) => (settled++, r));
    await new Promise((resolve) => setImmediate(resolve));
    expect(settled).toBe(0);
    expect(c.calls).toEqual([]);
    // Waiting members are replayable verifies: they do not count in flight.
    expect(c.kind.readiness().counts.inflight).toBe(0);
    const third = await c.send(member("g1", 1, "ok"), "r1");
    expect(third.json()).toEqual({ reward: 0 });
    expect((await first).json()).toEqual({ reward: 0 });
    expect((await second).json()).toEqual({ reward: 1 });
    expect(c.calls).toEqual([[0, 1, 2]]);
    await c.app.close();
  });

  it("an identical replay returns the cached reward without another judge call; a different payload is 409", async () => {
    const c = await cohortApp(2);
    const a = c.send(member("g2", 0, "best"));
    // An identical replay while collecting attaches as a waiter.
    const aAgain = c.send(member("g2", 0, "best"));
    await c.send(member("g2", 1, "other"));
    expect((await a).json()).toEqual({ reward: 1 });
    expect((await aAgain).json()).toEqual({ reward: 1 });
    const replay = await c.send(member("g2", 1, "other"));
    expect(replay.json()).toEqual({ reward: 0 });
    expect(c.calls).toHaveLength(1);
    const conflict = await c.send(member("g2", 1, "changed"));
    expect(conflict.statusCode).toBe(409);
    expect(conflict.json().error.code).toBe("cohort_slot_conflict");
    await c.app.close();
  });

  it("a newer group attempt supersedes older ones; invalid coordinates are 422", async () => {
    const c = await cohortApp(2);
    const old = c.send(member("g3", 0, "a", 0));
    await new Promise((resolve) => setImmediate(resolve));
    const newer = c.send(member("g3", 0, "best", 1));
    const oldReply = await old;
    expect(oldReply.statusCode).toBe(409);
    expect(oldReply.json().error.code).toBe("cohort_superseded");
    const late = await c.send(member("g3", 1, "b", 0));
    expect(late.json().error.code).toBe("cohort_superseded");
    await c.send(member("g3", 1, "b", 1));
    expect((await newer).json()).toEqual({ reward: 1 });
    for (const bad of [member("g3", 2, "x"), member("g3", -1, "x"), member("", 0, "x"), { ...member("g3", 0, "x"), _ng_group_attempt: "1" }]) {
      const reply = await c.send(bad);
      expect(reply.statusCode).toBe(422);
      expect(reply.json().error.code).toBe("invalid_coordinates");
    }
    await c.app.close();
  });

  it("a collection timeout from the first arrival fails the waiters with 503", async () => {
    const c = await cohortApp(3, { collectionTimeoutMs: 200 });
    const started = Date.now();
    const first = c.send(member("g4", 0, "a"));
    const duplicate = c.send(member("g4", 0, "a"));
    const replies = await Promise.all([first, duplicate]);
    for (const reply of replies) {
      expect(reply.statusCode).toBe(503);
      expect(reply.json().error.code).toBe("cohort_failed");
    }
    expect(Date.now() - started).toBeLessThan(2000);
    expect(c.calls).toEqual([]);
    // The failed attempt stays failed; the group is retried as a new attempt.
    expect((await c.send(member("g4", 1, "b"))).statusCode).toBe(503);
    await c.app.close();
  });

  it("judge failures and evaluation timeouts are masked 200 results, cached", async () => {
    let calls = 0;
    const failing: CohortJudge = async () => {
      calls += 1;
      throw new Error("judge exploded");
    };
    const c = await cohortApp(1, {}, { judge: failing, calls: [] });
    expect((await c.send(member("g5", 0, "x"))).json()).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed" });
    expect((await c.send(member("g5", 0, "x"))).json()).toMatchObject({ _ng_failure_class: "judge_failed" });
    expect(calls).toBe(1);
    const hanging: CohortJudge = () => new Promise(() => undefined);
    const h = await cohortApp(1, { evaluationTimeoutMs: 100 }, { judge: hanging, calls: [] });
    expect((await h.send(member("g6", 0, "x"))).json()).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed" });
    await c.app.close();
    await h.app.close();
  });

  it("the model judge asks the judge endpoint once per cohort", async () => {
    const judge = new JudgeClient({ baseUrl: stubUrl, requestTimeoutMs: 5000 });
    const c = await cohortApp(2, {}, { judge: modelCohortJudge(judge), calls: [] });
    const before = stubCalls.length;
    const a = c.send(member("g7", 0, "fine"));
    const b = await c.send(member("g7", 1, "best"));
    expect(b.json()).toEqual({ reward: 1 });
    expect((await a).json()).toEqual({ reward: 0 });
    expect(stubCalls.length - before).toBe(1);
    await c.app.close();
  });

  it("keeps no member's task or answer once judging starts; replays still compare the digest", async () => {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc") as () => void;
    const c = await cohortApp(2);
    // Only the table may keep the task alive: this test holds it weakly.
    const held = new WeakRef({ prompt: "x".repeat(1000) });
    const arrive = (index: number) => c.verifier.table.arrive({ groupId: "gm", attempt: 0, index }, `digest-${index}`, { index, answer: index ? "best" : "a", task: held.deref() });
    expect(await Promise.all([arrive(0), arrive(1)])).toEqual([{ reward: 0 }, { reward: 1 }]);
    // The finished cohort is kept for replays, but not the submissions it judged.
    await new Promise((resolve) => setTimeout(resolve, 0));
    gc();
    expect(held.deref()).toBeUndefined();
    expect(await c.verifier.table.arrive({ groupId: "gm", attempt: 0, index: 1 }, "digest-1", { index: 1, answer: "best", task: {} })).toEqual({ reward: 1 });
    await expect(c.verifier.table.arrive({ groupId: "gm", attempt: 0, index: 1 }, "other", { index: 1, answer: "best", task: {} })).rejects.toMatchObject({
      code: "cohort_slot_conflict",
    });
    expect(c.calls).toHaveLength(1);
    await c.app.close();
  });

  it("refuses collection and evaluation timeouts a timer cannot hold (past 2^31-1 ms they fired at once)", async () => {
    for (const setting of ["collectionTimeoutMs", "evaluationTimeoutMs"]) {
      expect(() => new CohortCompareVerifier({ size: 2, [setting]: 2 ** 31 }, scriptedJudge().judge)).toThrow(/at most 2147483647/);
    }
    // The longest one a timer holds is accepted.
    const c = await cohortApp(2, { collectionTimeoutMs: 2 ** 31 - 1, evaluationTimeoutMs: 2 ** 31 - 1 });
    const first = c.send(member("gt", 0, "a"));
    expect((await c.send(member("gt", 1, "best"))).json()).toEqual({ reward: 1 });
    expect((await first).json()).toEqual({ reward: 0 });
    await c.app.close();
  });

  it("a newer attempt superseding a cohort being judged aborts its judge call", async () => {
    const signals: AbortSignal[] = [];
    const judge: CohortJudge = (members, signal) => {
      signals.push(signal);
      // Answers only for the newer attempt; the older one's call hangs until it is aborted.
      return signals.length > 1 ? Promise.resolve(members.map(() => 1)) : new Promise(() => undefined);
    };
    const c = await cohortApp(1, { evaluationTimeoutMs: 600_000 }, { judge, calls: [] });
    const old = c.send(member("gs", 0, "a", 0));
    await waitUntil(() => signals.length === 1, "the first attempt is being judged");
    expect((await c.send(member("gs", 0, "a", 1))).json()).toEqual({ reward: 1 });
    expect((await old).json().error.code).toBe("cohort_superseded");
    // Nobody reads that result any more: the call (and the members it holds) is let go at once.
    expect(signals[0]!.aborted).toBe(true);
    expect(c.verifier.table.activeCohorts).toBe(0);
    await c.app.close();
  });

  it("refuses a new cohort beyond maxActiveCohorts with 503 cohort_capacity, changing nothing", async () => {
    const c = await cohortApp(2, { maxActiveCohorts: 2 });
    const waiting = [c.send(member("ca", 0, "best")), c.send(member("cb", 0, "best"))];
    await waitUntil(() => c.verifier.table.activeCohorts === 2, "two collecting cohorts");
    const refused = await c.send(member("cc", 0, "best"));
    expect(refused.statusCode).toBe(503);
    expect(refused.json().error.code).toBe("cohort_capacity");
    expect(c.verifier.table.activeCohorts).toBe(2);
    // Members of cohorts already started are admitted, and a newer attempt replaces its old one.
    expect((await c.send(member("ca", 1, "b"))).json()).toEqual({ reward: 0 });
    const newer = c.send(member("cb", 0, "best", 1));
    expect((await waiting[1]!).json().error.code).toBe("cohort_superseded");
    expect(c.verifier.table.activeCohorts).toBe(1);
    // Room again: the refused group starts from scratch, as if it had never been seen.
    const again = c.send(member("cc", 0, "best"));
    expect((await c.send(member("cc", 1, "b"))).json()).toEqual({ reward: 0 });
    expect((await again).json()).toEqual({ reward: 1 });
    await c.send(member("cb", 1, "b", 1));
    expect((await newer).json()).toEqual({ reward: 1 });
    expect((await waiting[0]!).json()).toEqual({ reward: 1 });
    expect(c.verifier.table.activeCohorts).toBe(0);
    await c.app.close();
  });

  describe("after a crash (the cohort table is process-local)", () => {
    it("members that had not recorded their reward re-verify and rebuild the cohort", async () => {
      const before = await cohortApp(3);
      // Two members wait; the process dies before the third arrives.
      void before.send(member("g8", 0, "best")).catch(() => undefined);
      void before.send(member("g8", 1, "b")).catch(() => undefined);
      await new Promise((resolve) => setImmediate(resolve));
      await before.app.close();
      // Restored episodes replay their /verify (replayable) into a fresh, empty table.
      const after = await cohortApp(3);
      const replays = [after.send(member("g8", 0, "best"), "r0-a1"), after.send(member("g8", 1, "b"), "r1-a1")];
      const third = await after.send(member("g8", 2, "c"), "r2");
      expect([...(await Promise.all(replays)).map((r) => r.json()), third.json()]).toEqual([{ reward: 1 }, { reward: 0 }, { reward: 0 }]);
      expect(before.calls).toEqual([]);
      expect(after.calls).toEqual([[0, 1, 2]]);
      await after.app.close();
    });

    it("a crash after the result but before every member recorded it fails the replays after the collection timeout", async () => {
      const before = await cohortApp(2);
      const results = await Promise.all([before.send(member("g9", 0, "best")), before.send(member("g9", 1, "b"))]);
      expect(results.map((r) => r.json())).toEqual([{ reward: 1 }, { reward: 0 }]);
      await before.app.close();
      // Member 0 recorded its reward; member 1 did not and replays into the fresh process alone.
      const after = await cohortApp(2, { collectionTimeoutMs: 150 });
      const lonely = await after.send(member("g9", 1, "b"), "r1-a1");
      expect(lonely.statusCode).toBe(503);
      expect(lonely.json().error.code).toBe("cohort_failed");
      expect(after.calls).toEqual([]);
      // Retried from input: the whole group runs again as a new group attempt.
      const retry = await Promise.all([after.send(member("g9", 0, "best", 1)), after.send(member("g9", 1, "b", 1))]);
      expect(retry.map((r) => r.json())).toEqual([{ reward: 1 }, { reward: 0 }]);
      await after.app.close();
    });
  });
});
