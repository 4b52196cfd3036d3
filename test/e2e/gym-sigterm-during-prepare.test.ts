import { spawn, type ChildProcess } from "node:child_process";
import { createServer, type Server } from "node:http";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { controlRequest, phase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt } from "./coordinator-process.js";

// A reference server's SIGTERM stops its participant first, which waits for the control answers
// being computed: a prepare waiting for a blocker must not hold the process (and its port) until
// the prepare's deadline, long after its membership entry is gone.
const DEPLOYMENT = `sigprep${process.pid}`;
const TOKEN = "t0ken";
const PREPARE_SECONDS = 25;
let nats: NatsFixture;
let stub: Server;
let stubUrl: string;
const seen = new TrackedProcesses();

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  // Agent and resources in one stub: the seed makes verify a `wait` step, and verify never answers (a blocker).
  stub = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const url = req.url ?? "";
      if (url.endsWith("/verify")) return; // hangs
      if (url.endsWith("/seed_session")) {
        res.writeHead(200, { "content-type": "application/json", "x-ng-checkpoint-verify": "wait", "set-cookie": "ng_session=s1" });
        return res.end("{}");
      }
      res.writeHead(200, { "content-type": "application/json" });
      if (url.endsWith("/open_session")) return res.end(JSON.stringify({ session_key: "r1", restored: false }));
      if (url.endsWith("/activate")) return res.end(JSON.stringify({ answer: "42" }));
      res.end("{}");
    });
  });
  await new Promise<void>((resolve) => stub.listen(0, "127.0.0.1", resolve));
  stubUrl = `http://127.0.0.1:${(stub.address() as { port: number }).port}`;
});
afterAll(async () => {
  killAll(seen);
  stub?.closeAllConnections();
  await new Promise((resolve) => stub?.close(resolve));
  await nats?.close();
});

describe("environment server SIGTERMed while a prepare waits for a blocker", () => {
  it("exits promptly (not at the prepare's deadline), and the prepare is answered as not prepared", async () => {
    const child: ChildProcess = spawn(
      process.execPath,
      ["dist/participants/gym/environment-server/main.js", "--nats", nats.server.url, "--deployment", DEPLOYMENT, "--token", TOKEN, "--agent-url", stubUrl, "--resources-url", stubUrl],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    seen.add(child.pid!);
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    let stderr = "";
    child.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    const url = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on("line", (line) => {
        if (line.includes('"ready":true')) resolve((JSON.parse(line) as { url: string }).url);
      });
      void exited.then((code) => reject(new Error(`environment server exited early (${code}): ${stderr}`)));
    });
    const run = fetch(`${url}/run`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rollout_id: "r1", attempt: 0, task: { expression: "1+1", tool_rounds: 1 } }),
    }).catch(() => undefined);
    const target = { deployment: DEPLOYMENT, kind: "environment" as const, instance: "environment-server", token: TOKEN };
    await waitUntil(async () => (await controlRequest(nats.nc, target, "status", {})).report.blocker_count === 1, "the episode waiting in its verify step");
    const prepare = controlRequest(nats.nc, target, "prepare", phase("c1", {}, PREPARE_SECONDS), (PREPARE_SECONDS + 10) * 1000);
    await waitUntil(async () => (await controlRequest(nats.nc, target, "status", {})).phase === "preparing", "the prepare waiting for the blocker");

    const started = Date.now();
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(Date.now() - started).toBeLessThan(5_000);
    expect((await prepare).phase).toBe("preparing");
    await run;
  }, 60_000);

  it("a /run still running after the shutdown drain is cut, and the server says so in its log", async () => {
    const child: ChildProcess = spawn(
      process.execPath,
      ["dist/participants/gym/environment-server/main.js", "--nats", nats.server.url, "--deployment", `${DEPLOYMENT}-drain`, "--token", TOKEN, "--agent-url", stubUrl, "--resources-url", stubUrl],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    seen.add(child.pid!);
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const logs: string[] = [];
    let stderr = "";
    child.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    const url = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on("line", (line) => {
        logs.push(line);
        if (line.includes('"ready":true')) resolve((JSON.parse(line) as { url: string }).url);
      });
      void exited.then((code) => reject(new Error(`environment server exited early (${code}): ${stderr}`)));
    });
    const run = fetch(`${url}/run`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rollout_id: "r2", attempt: 0, task: { expression: "1+1", tool_rounds: 1 } }),
    }).then(
      () => "answered",
      () => "cut",
    );
    const target = { deployment: `${DEPLOYMENT}-drain`, kind: "environment" as const, instance: "environment-server", token: TOKEN };
    await waitUntil(async () => (await controlRequest(nats.nc, target, "status", {})).report.blocker_count === 1, "the episode waiting in its verify step");
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(await run).toBe("cut");
    const cut = logs.map((line) => JSON.parse(line) as { level?: number; msg?: string; connections?: number }).find((entry) => entry.msg?.includes("cut"));
    expect(cut).toMatchObject({ level: 40, connections: 1 });
  }, 60_000);
});
