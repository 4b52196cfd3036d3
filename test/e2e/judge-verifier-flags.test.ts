/** Real processes: a nats-server, a judge HTTP server in this process, and the equivalence verifier spawned from dist/. */
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { startNats, type NatsFixture } from "../support/nats.js";

const VERIFIER = join(process.cwd(), "dist/participants/verifiers/main.js");
let nats: NatsFixture;
let root: string;
let judge: Server;
let judgeUrl: string;
/** What the judge was sent, per request; `hold` keeps the next requests unanswered. */
const seen: { authorization: string | undefined }[] = [];
const held: IncomingMessage[] = [];
let hold = false;
const programs: ChildProgram[] = [];

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-judge-flags-"));
  judge = createServer((req, res) => {
    seen.push({ authorization: req.headers.authorization });
    if (hold) {
      held.push(req);
      return;
    }
    req.resume();
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify({ choices: [{ message: { content: "YES" } }] }));
  });
  await new Promise<void>((resolve) => judge.listen(0, "127.0.0.1", resolve));
  judgeUrl = `http://127.0.0.1:${(judge.address() as AddressInfo).port}`;
});
afterAll(async () => {
  for (const p of programs) await p.kill("SIGKILL");
  judge.closeAllConnections();
  await new Promise((resolve) => judge.close(resolve));
  await nats.close();
  await rm(root, { recursive: true, force: true });
});

async function startVerifier(instance: string, flags: string[], env: NodeJS.ProcessEnv = {}): Promise<string> {
  const prog = await startChildProgram(
    VERIFIER,
    ["--verifier", "equivalence", "--judge-url", judgeUrl, ...flags, "--nats", nats.server.url, "--deployment", "judgeflags", "--instance", instance, "--token", "tok", "--checkpoint-root", root],
    { waitReady: true, readyTimeoutMs: 20000, env },
  );
  programs.push(prog);
  return String(prog.ready!.url);
}

/** One seeded session's verify, bounded so a judge call that is not cut short fails the test instead of hanging it. */
async function verify(url: string, rollout: string): Promise<Record<string, unknown>> {
  const seed = await fetch(`${url}/ng-rollout/${rollout}/seed_session`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const cookie = seed.headers.get("set-cookie")!.split(";")[0]!;
  const answered = await fetch(`${url}/ng-rollout/${rollout}/verify`, {
    method: "POST",
    headers: { "content-type": "application/json", cookie },
    body: JSON.stringify({ task: { expected_answer: "Paris" }, answer: "Paris" }),
    signal: AbortSignal.timeout(15_000),
  });
  expect(answered.status).toBe(200);
  return (await answered.json()) as Record<string, unknown>;
}

describe("equivalence verifier's judge flags, real process", () => {
  it("sends the judge GYM_CKPT_JUDGE_API_KEY as a bearer token, and --judge-timeout-ms bounds a call the judge never answers", async () => {
    const url = await startVerifier("eq1", ["--judge-timeout-ms", "500"], { GYM_CKPT_JUDGE_API_KEY: "judge-secret" });
    expect(await verify(url, "r1")).toMatchObject({ reward: 1 });
    expect(seen.at(-1)).toEqual({ authorization: "Bearer judge-secret" });
    hold = true;
    const started = Date.now();
    // Without the flag the default (60 s) would apply and the bounded fetch above would fail.
    expect(await verify(url, "r2")).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed" });
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(held.length).toBe(1);
    hold = false;
  }, 60_000);

  it("refuses a judge timeout that is not a whole number of milliseconds a timer holds, or zero, at start-up (exit 2)", async () => {
    for (const value of ["abc", "0", "2147483648"]) {
      const prog = await startChildProgram(
        VERIFIER,
        ["--verifier", "equivalence", "--judge-url", judgeUrl, "--judge-timeout-ms", value, "--nats", nats.server.url, "--deployment", "judgeflags", "--instance", "bad", "--token", "tok", "--checkpoint-root", root],
        {},
      );
      programs.push(prog);
      expect([value, (await prog.exited).code]).toEqual([value, 2]);
    }
  }, 60_000);
});
