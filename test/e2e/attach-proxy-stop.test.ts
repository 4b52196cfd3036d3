import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { headers } from "@nats-io/transport-node";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { HEADER_AUTHORIZATION, participantSubject } from "../../protocol/index.js";
import { listenLocal } from "../support/attach-proxy-fixture.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { freePortRun } from "../support/ports.js";
import { killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";
import { STOP_WITH_LAUNCHER_ENV } from "../../participants/gym/gym-launcher.js";
import { PROXY_ENTRY } from "./model-processes.js";

// The attach proxy's stop, with real processes: a stopping proxy takes no new call, answers what it
// holds with a catalog code, lets started responses finish (their rows written), and closes its
// ledger before it exits, so its directory holds rows of delivered calls only and no lock file,
// owner file or take-over entry a next start would have to break.
const TOKEN = "t0ken";
const DEPLOYMENT = `attachstop${process.pid}`;
let nats: NatsFixture;
const seen = new TrackedProcesses();

beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  killAll(seen);
  await nats?.close();
});

/**
 * A fake OpenAI upstream: streams one event, then `[DONE]` at once, or when the test releases a
 * held call (`x-test-hold`); `x-test-wait` calls get no answer at all until the test writes one.
 */
interface Upstream {
  url: string;
  server: Server;
  calls: IncomingHttpHeaders[];
  held: ServerResponse[];
  waiting: ServerResponse[];
}
let upstream: Upstream;
let dir: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-stop-"));
  const calls: IncomingHttpHeaders[] = [];
  const held: ServerResponse[] = [];
  const waiting: ServerResponse[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      calls.push(req.headers);
      if (req.headers["x-test-wait"]) return void waiting.push(res);
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write('data: {"choices":[{"delta":{"content":"He"}}]}\n\n');
      if (req.headers["x-test-hold"]) held.push(res);
      else res.end("data: [DONE]\n\n");
    });
  });
  upstream = { url: await listenLocal(server), server, calls, held, waiting };
});
afterEach(async () => {
  upstream.server.closeAllConnections();
  await new Promise((resolve) => upstream.server.close(resolve));
  await rm(dir, { recursive: true, force: true });
});

interface Answer {
  status: number;
  body: string;
  error?: string;
}

/** A streamed chat call for `key` on a connection of its own; `hold`: see Upstream. */
function call(port: number, key: string, hold: false | "hold" | "wait" = false): Promise<Answer> {
  return new Promise((resolve) => {
    const req = request(
      { host: "127.0.0.1", port, path: `/ng-rollout/${key}/v1/chat/completions`, method: "POST", agent: false, headers: { "content-type": "application/json", ...(hold && { [`x-test-${hold}`]: "1" }) } },
      (res) => {
        let body = "";
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (body += chunk));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        res.on("error", (error) => resolve({ status: res.statusCode ?? 0, body, error: error.message }));
      },
    );
    req.on("error", (error) => resolve({ status: 0, body: "", error: (error as NodeJS.ErrnoException).code ?? error.message }));
    req.end(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] }));
  });
}

interface Proxy {
  child: ChildProcess;
  lines: string[];
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * Starts the proxy on `port` with the test's ledger directory; `waitReady` waits for its ready line.
 * `fromLauncher`: started as the Gym launcher starts it, its stdin a pipe from here whose EOF stops it.
 */
async function startProxy(instance: string, port: number, waitReady: boolean, fromLauncher = false): Promise<Proxy> {
  const args = ["--upstream", `${upstream.url}/v1`, "--listen", `127.0.0.1:${port}`, "--ledger-dir", dir, "--cuts", "off"];
  const child = spawn(process.execPath, [PROXY_ENTRY, ...args, "--nats", nats.server.url, "--deployment", DEPLOYMENT, "--instance", instance, "--token", TOKEN], {
    stdio: [fromLauncher ? "pipe" : "ignore", "pipe", "pipe"],
    env: { ...process.env, ...(fromLauncher && { [STOP_WITH_LAUNCHER_ENV]: "1" }) },
  });
  seen.add(child.pid!);
  const lines: string[] = [];
  for (const stream of [child.stdout!, child.stderr!]) createInterface({ input: stream }).on("line", (line) => void lines.push(line));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
  if (waitReady) await waitUntil(() => lines.some((line) => line.includes('"ready":true')), `the proxy's ready line: ${lines.join("\n")}`);
  return { child, lines, exited };
}

function kill(proxy: Proxy): void {
  if (proxy.child.exitCode === null && proxy.child.signalCode === null) proxy.child.kill("SIGKILL");
}

/** Every entry under the ledger directory's `locks/`, hidden ones included. */
async function lockEntries(): Promise<string[]> {
  return readdir(join(dir, "locks")).catch(() => []);
}

async function rowsOf(key: string): Promise<{ model_call_id: string; parent_call_id: string | null }[]> {
  const text = await readFile(join(dir, `${key}.lineage.jsonl`), "utf8");
  return text
    .split("\n")
    .filter(Boolean)
    .map((line) => JSON.parse(line) as { model_call_id: string; parent_call_id: string | null });
}

/** A refused call's catalog code, or its connection error; anything else as status and body. */
function refusalOf(answer: Answer): string | undefined {
  if (answer.status === 0) return answer.error;
  try {
    return (JSON.parse(answer.body) as { error: { code: string } }).error.code;
  } catch {
    return `${answer.status} ${answer.body}`;
  }
}

function listenersUp(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const req = request({ host: "127.0.0.1", port, path: "/health", agent: false }, (res) => {
      res.resume();
      resolve(res.statusCode === 200);
    });
    req.on("error", () => resolve(false));
    req.end();
  });
}

/** How a stop reaches the proxy: SIGTERM (sent twice, as a group signal forwarded by a wrapper is), or its parent's pipe closing. */
const stops = [
  { name: "SIGTERM, twice", fromLauncher: false, stop: (proxy: Proxy) => void (proxy.child.kill("SIGTERM"), proxy.child.kill("SIGTERM")) },
  { name: "its launcher's pipe closing", fromLauncher: true, stop: (proxy: Proxy) => void proxy.child.stdin!.end() },
];

describe.each(stops)("attach proxy: stopped by $name while its participant starts", ({ name, fromLauncher, stop }) => {
  it("takes no new call, finishes the started one with its row, closes the ledger, and the next start continues it", async () => {
    const instance = `policy-startstop-${fromLauncher ? "pipe" : "term"}`;
    const port = await freePortRun(1);
    // A silent subscriber on the status subject: the start's claim probe waits its full 2 s for an answer.
    let probed = false;
    const tap = nats.nc.subscribe(participantSubject(DEPLOYMENT, "model", instance, "status"), { callback: () => void (probed = true) });
    await nats.nc.flush();
    const proxy = await startProxy(instance, port, false, fromLauncher);
    try {
      await waitUntil(() => probed, "the start's claim probe");
      // Listening already while the participant starts: one call delivered, one streaming.
      expect((await call(port, "rs1")).status).toBe(200);
      const streaming = call(port, "rs1", "hold");
      await waitUntil(() => upstream.held.length === 1, "the streaming call at the upstream");
      stop(proxy);
      await waitUntil(() => proxy.lines.some((line) => line.includes('"msg":"shutting down"')), `the shutdown to begin (${name})`);
      // From the signal on, no call reaches the upstream: refused with a catalog code, or not connected at all.
      const late = await call(port, "rs2");
      expect(refusalOf(late)).toMatch(/^(ECONNREFUSED|admission_closed)$/);
      expect(upstream.calls.length).toBe(2);
      // The started response finishes during the stop, its row written before the ledger closes.
      upstream.held[0]!.end("data: [DONE]\n\n");
      expect(await streaming).toEqual({ status: 200, body: expect.stringContaining("data: [DONE]") });
      expect(await proxy.exited).toEqual({ code: 0, signal: null });
    } finally {
      tap.unsubscribe();
      kill(proxy);
    }
    expect(proxy.lines.filter((line) => !line.startsWith("{"))).toEqual([]);
    expect(await lockEntries()).toEqual([]);
    const rows = await rowsOf("rs1");
    expect(rows.map((row) => row.model_call_id)).toEqual(upstream.calls.map((headers) => headers["x-ng-model-call-id"]));

    // A next start on the same directory has nothing to break and continues the lineage.
    const next = await startProxy(instance, port, true);
    try {
      expect((await call(port, "rs1")).status).toBe(200);
      expect(upstream.calls.at(-1)!["x-ng-parent-call-id"]).toBe(rows.at(-1)!.model_call_id);
      next.child.kill("SIGTERM");
      expect(await next.exited).toEqual({ code: 0, signal: null });
    } finally {
      kill(next);
    }
    expect(await lockEntries()).toEqual([]);
    expect(await listenersUp(port)).toBe(false);
  }, 40_000);
});

describe("attach proxy: SIGTERM while a checkpoint holds a response", () => {
  it("answers the held call admission_closed, writes no row for it, and closes the ledger", async () => {
    const instance = "policy-heldstop";
    const port = await freePortRun(1);
    const proxy = await startProxy(instance, port, true);
    try {
      expect((await call(port, "hs1")).status).toBe(200);
      // A call the upstream has not answered yet, then a prepare: its response start is held until a
      // resume that never comes.
      const held = call(port, "hs1", "wait");
      await waitUntil(() => upstream.waiting.length === 1, "the call at the upstream");
      const auth = headers();
      auth.set(HEADER_AUTHORIZATION, `Bearer ${TOKEN}`);
      const prepare = { checkpoint_id: "ck-heldstop", deadline_ts: Date.now() / 1000 + 60, epoch: 1 };
      const prepared = await nats.nc.request(participantSubject(DEPLOYMENT, "model", instance, "prepare"), JSON.stringify(prepare), { headers: auth, timeout: 10_000 });
      expect(prepared.json<{ error?: unknown }>().error).toBeUndefined();
      upstream.waiting[0]!.writeHead(200, { "content-type": "text/event-stream" });
      upstream.waiting[0]!.write('data: {"choices":[{"delta":{"content":"He"}}]}\n\n');
      await waitUntil(async () => (await status(port)).counts.held === 1, "its response to be held");
      proxy.child.kill("SIGTERM");
      const answer = await held;
      expect({ status: answer.status, code: refusalOf(answer) }).toEqual({ status: 409, code: "admission_closed" });
      expect(await proxy.exited).toEqual({ code: 0, signal: null });
    } finally {
      kill(proxy);
    }
    expect(proxy.lines.filter((line) => !line.startsWith("{"))).toEqual([]);
    expect(await lockEntries()).toEqual([]);
    // Only the delivered call has a row: the held one was never answered.
    expect((await rowsOf("hs1")).map((row) => row.model_call_id)).toEqual([upstream.calls[0]!["x-ng-model-call-id"]]);
  }, 40_000);
});

/** The proxy's readiness counts (`/ng-capture/v1/status`). */
function status(port: number): Promise<{ counts: Record<string, number> }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, path: "/ng-capture/v1/status", agent: false, headers: { authorization: `Bearer ${TOKEN}` } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve(JSON.parse(body) as { counts: Record<string, number> }));
    });
    req.on("error", reject);
    req.end();
  });
}
