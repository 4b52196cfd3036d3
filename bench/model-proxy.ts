import { spawn, type ChildProcess } from "node:child_process";
import { Agent, request } from "node:http";
import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { cpus, loadavg, tmpdir } from "node:os";
import path, { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { NatsServerProcess } from "../coordinator/local/nats-server-process.js";
import { machine, percentile, writeSection } from "./bench-report.js";

/**
 * Attach-proxy overhead: streamed chat completions at 64 concurrent streams against the reference
 * backend directly, through a bare Node pipe proxy (the floor of any HTTP hop written in Node, no
 * participant), and through the attach proxy (a model participant with tickets and a capture
 * ledger), measured side by side in rounds whose order rotates. Reports the added p50 latency per
 * request and the throughput ratio. Targets: ≤ 1 ms added p50, ≥ 90% of direct throughput.
 */
const CONCURRENCY = 64;
const REQUESTS_PER_ROUND = 768;
const ROUNDS = 6;
const ANSWER_TOKENS = "32";
/** Calls spread over this many rollouts (capture keys); each makes a call every few hundred requests, like a multi-turn agent. */
const ROLLOUTS = 256;
/** Paces the backend like an inference server (a GPU-bound token rate), so the figures measure the proxy, not CPU contention between three processes on one machine. */
const TOKEN_DELAY_MS = 2;

const participantsDir = join(dirname(fileURLToPath(import.meta.url)), "..", "participants");

/** The reference hop: strip the rollout prefix, forward the body, pipe the answer back. */
const BARE_PROXY = `
import { Agent, createServer, request } from "node:http";
const upstream = new URL(process.env.BARE_UPSTREAM);
const agent = new Agent({ keepAlive: true, maxSockets: Infinity, noDelay: true });
const server = createServer({ noDelay: true, keepAlive: true }, (req, res) => {
  const path = req.url.startsWith("/ng-rollout/") ? req.url.slice(req.url.indexOf("/", "/ng-rollout/".length)) : req.url;
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const body = Buffer.concat(chunks);
    const up = request({ hostname: upstream.hostname, port: upstream.port, path, method: req.method, agent, headers: { "content-type": "application/json", "content-length": body.length } }, (r) => {
      res.writeHead(r.statusCode, r.headers);
      r.pipe(res);
    });
    up.end(body);
  });
});
server.listen(0, "127.0.0.1", () => console.log(JSON.stringify({ ready: true, url: "http://127.0.0.1:" + server.address().port })));
`;

function waitReady(child: ChildProcess, what: string): Promise<{ child: ChildProcess; url: string }> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} not ready`)), 20_000);
    createInterface({ input: child.stdout! }).on("line", (line) => {
      try {
        const parsed = JSON.parse(line) as { ready?: boolean; url?: string };
        if (parsed.ready && parsed.url) {
          clearTimeout(timer);
          resolve({ child, url: parsed.url.replace(/\/+$/, "") });
        }
      } catch {
        // log line
      }
    });
    child.once("exit", (code) => reject(new Error(`${what} exited with ${code}`)));
  });
}

function spawnReady(entry: string, args: string[]): Promise<{ child: ChildProcess; url: string }> {
  return waitReady(spawn(process.execPath, [join(participantsDir, entry), ...args], { stdio: ["ignore", "pipe", "inherit"] }), entry);
}

/** CPU milliseconds a child used so far (Linux /proc), or null elsewhere. */
function cpuMs(child: ChildProcess): number | null {
  try {
    const fields = readFileSync(`/proc/${child.pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
  } catch {
    return null;
  }
}

function streamOnce(agent: Agent, base: string, pathName: string, body: string): Promise<number> {
  const url = new URL(base + pathName);
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = request(
      { hostname: url.hostname, port: url.port, path: url.pathname, method: "POST", agent, headers: { "content-type": "application/json", "content-length": Buffer.byteLength(body) } },
      (res) => {
        if (res.statusCode !== 200) return reject(new Error(`HTTP ${res.statusCode}`));
        res.on("data", () => undefined);
        res.on("end", () => resolve(performance.now() - started));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

async function round(base: string, route: (i: number) => string): Promise<{ latencies: number[]; seconds: number }> {
  const agent = new Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  const body = JSON.stringify({
    model: "policy",
    stream: true,
    messages: [
      { role: "system", content: "bench" },
      { role: "user", content: "Compute: 1 + 1" },
    ],
    metadata: { answer_tokens: ANSWER_TOKENS },
  });
  const latencies: number[] = [];
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next < REQUESTS_PER_ROUND) {
        const i = next++;
        latencies.push(await streamOnce(agent, base, route(i), body));
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  agent.destroy();
  return { latencies, seconds };
}

interface Side {
  name: string;
  url: string;
  route: (round: number, i: number) => string;
  /** The proxy process whose CPU is reported, if any. */
  proxy: ChildProcess | null;
  latencies: number[];
  seconds: number;
  cpuMs: number | null;
}

export async function run(): Promise<void> {
  const nats = await NatsServerProcess.start();
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-bench-model-"));
  const children: ChildProcess[] = [];
  try {
    const common = (instance: string) => ["--nats", nats.url, "--deployment", "benchmodel", "--instance", instance, "--token", "bench-token", "--port", "0"];
    const backend = await spawnReady("gym/policy-backend/main.js", [...common("policy_backend"), "--token-delay-ms", String(TOKEN_DELAY_MS)]);
    children.push(backend.child);
    const proxy = await spawnReady("attach/main.js", [...common("policy_model"), "--upstream", `${backend.url}/v1`, "--ledger-dir", join(dir, "ledger")]);
    children.push(proxy.child);
    const bareChild = spawn(process.execPath, ["--input-type=module", "-e", BARE_PROXY], { stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, BARE_UPSTREAM: backend.url } });
    children.push(bareChild);
    const bare = await waitReady(bareChild, "bare proxy");
    const sides: Side[] = [
      { name: "direct", url: backend.url, route: () => "/v1/chat/completions", proxy: null, latencies: [], seconds: 0, cpuMs: null },
      { name: "bare Node pipe proxy (no participant)", url: bare.url, route: (_r, i) => `/ng-rollout/bare-${i % ROLLOUTS}/v1/chat/completions`, proxy: bare.child, latencies: [], seconds: 0, cpuMs: 0 },
      { name: "attach proxy", url: proxy.url, route: (_r, i) => `/ng-rollout/bench-${i % ROLLOUTS}/v1/chat/completions`, proxy: proxy.child, latencies: [], seconds: 0, cpuMs: 0 },
    ];
    // Warm-up, then rotate the order every round so every side sees the same machine state.
    for (const side of sides) await round(side.url, (i) => side.route(ROUNDS, i));
    for (let r = 0; r < ROUNDS; r++) {
      for (let k = 0; k < sides.length; k++) {
        const side = sides[(r + k) % sides.length]!;
        const before = side.proxy ? cpuMs(side.proxy) : null;
        const result = await round(side.url, (i) => side.route(r, i));
        const after = side.proxy ? cpuMs(side.proxy) : null;
        side.latencies.push(...result.latencies);
        side.seconds += result.seconds;
        side.cpuMs = before === null || after === null || side.cpuMs === null ? null : side.cpuMs + (after - before);
      }
    }
    const total = REQUESTS_PER_ROUND * ROUNDS;
    const stats = sides.map((side) => ({
      side,
      p50: percentile(side.latencies, 50),
      p99: percentile(side.latencies, 99),
      rps: total / side.seconds,
      cpu: side.cpuMs === null ? "—" : `${((1000 * side.cpuMs) / total).toFixed(0)} µs`,
    }));
    const [direct, hop, attach] = stats as [(typeof stats)[0], (typeof stats)[0], (typeof stats)[0]];
    const added = attach.p50 - direct.p50;
    const ratio = attach.rps / direct.rps;
    const ok = added <= 1 && ratio >= 0.9;
    const markdown = [
      "## Attach proxy overhead (model participant)",
      "",
      `Command: \`npm run bench -- model-proxy\`. Machine: ${machine()}.`,
      "",
      `${CONCURRENCY} concurrent streamed chat completions (${ANSWER_TOKENS} filler tokens + final chunk each, ${TOKEN_DELAY_MS} ms between tokens), ${ROUNDS} rounds of ${REQUESTS_PER_ROUND} requests per side in rotating order, spread over ${ROLLOUTS} rollouts (≈ ${Math.round(((ROUNDS + 1) * REQUESTS_PER_ROUND) / ROLLOUTS)} calls each, so each rollout's ledger file is created once and appended to afterwards), against the reference backend directly, through a bare Node pipe proxy (the cost of any HTTP hop written in Node, no participant), and through the attach proxy (tickets, lineage headers, a capture-ledger row per call). Client, backend and proxy share the machine.`,
      "",
      "| path | p50 latency | p99 latency | throughput | proxy CPU per request |",
      "| --- | --- | --- | --- | --- |",
      ...stats.map((s) => `| ${s.side.name} | ${s.p50.toFixed(2)} ms | ${s.p99.toFixed(2)} ms | ${s.rps.toFixed(0)} req/s | ${s.side.proxy ? s.cpu : "—"} |`),
      "",
      `Added p50 per request: ${added.toFixed(2)} ms (target ≤ 1 ms). Throughput ratio: ${(100 * ratio).toFixed(1)}% of direct (target ≥ 90%). ${ok ? "Both targets met." : "TARGET MISSED."}`,
      `Against the bare hop, the participant adds ${(attach.p50 - hop.p50).toFixed(2)} ms p50 and keeps ${((100 * attach.rps) / hop.rps).toFixed(1)}% of its throughput.`,
      "",
      `Client, backend and proxy share ${cpus().length} cores (load average ${loadavg()[0]!.toFixed(1)} at the end of the run, other work included): CPU spent in a proxy delays the backend's token timers and shows up as latency, so the bare hop's own cost bounds what any proxy written in Node reaches here; the participant's share is the difference between the last two rows.`,
    ].join("\n");
    console.log(markdown);
    await writeSection("model-proxy", markdown);
    if (!ok) process.exitCode = 1;
  } finally {
    for (const child of children) child.kill("SIGKILL");
    await nats.dispose();
    await rm(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  run().catch((error: unknown) => {
    console.error(error);
    process.exit(1);
  });
}
