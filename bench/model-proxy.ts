import { spawn, type ChildProcess } from "node:child_process";
import { Agent, request } from "node:http";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path, { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";
import { NatsServerProcess } from "../coordinator/local/nats-server-process.js";
import { machine, percentile, writeSection } from "./bench-report.js";

/**
 * Attach-proxy overhead: streamed chat completions at 64 concurrent streams against the reference
 * backend directly and through the attach proxy (a model participant with tickets and a capture
 * ledger), measured side by side in alternating rounds. Reports the added p50 latency per request
 * and the throughput ratio. Targets: ≤ 1 ms added p50, ≥ 90% of direct throughput.
 */
const CONCURRENCY = 64;
const REQUESTS_PER_ROUND = 1280;
const ROUNDS = 3;
const ANSWER_TOKENS = "32";
/** Paces the backend like an inference server (a GPU-bound token rate), so the figures measure the proxy, not CPU contention between three processes on one machine. */
const TOKEN_DELAY_MS = 2;

const participantsDir = join(dirname(fileURLToPath(import.meta.url)), "..", "participants");

function spawnReady(entry: string, args: string[]): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, [join(participantsDir, entry), ...args], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${entry} not ready`)), 20_000);
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
    child.once("exit", (code) => reject(new Error(`${entry} exited with ${code}`)));
  });
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
    const direct = { latencies: [] as number[], seconds: 0 };
    const proxied = { latencies: [] as number[], seconds: 0 };
    // Warm-up, then alternate so both sides see the same machine state.
    await round(backend.url, () => "/v1/chat/completions");
    await round(proxy.url, (i) => `/ng-rollout/warm-${i % 256}/v1/chat/completions`);
    for (let r = 0; r < ROUNDS; r++) {
      const d = await round(backend.url, () => "/v1/chat/completions");
      const p = await round(proxy.url, (i) => `/ng-rollout/bench-${r}-${i % 256}/v1/chat/completions`);
      direct.latencies.push(...d.latencies);
      direct.seconds += d.seconds;
      proxied.latencies.push(...p.latencies);
      proxied.seconds += p.seconds;
    }
    const total = REQUESTS_PER_ROUND * ROUNDS;
    const p50d = percentile(direct.latencies, 50);
    const p50p = percentile(proxied.latencies, 50);
    const p99d = percentile(direct.latencies, 99);
    const p99p = percentile(proxied.latencies, 99);
    const rpsD = total / direct.seconds;
    const rpsP = total / proxied.seconds;
    const added = p50p - p50d;
    const ratio = rpsP / rpsD;
    const ok = added <= 1 && ratio >= 0.9;
    const markdown = [
      "## Attach proxy overhead (model participant)",
      "",
      `Command: \`npm run bench -- model-proxy\`. Machine: ${machine()}.`,
      "",
      `${CONCURRENCY} concurrent streamed chat completions (${ANSWER_TOKENS} filler tokens + final chunk each, ${TOKEN_DELAY_MS} ms between tokens), ${ROUNDS} alternating rounds of ${REQUESTS_PER_ROUND} requests per side, against the reference backend directly and through the attach proxy (tickets, lineage headers, a capture-ledger row per call with its striped lock). Client, backend and proxy share the machine.`,
      "",
      "| path | p50 latency | p99 latency | throughput |",
      "| --- | --- | --- | --- |",
      `| direct | ${p50d.toFixed(2)} ms | ${p99d.toFixed(2)} ms | ${rpsD.toFixed(0)} req/s |`,
      `| through the attach proxy | ${p50p.toFixed(2)} ms | ${p99p.toFixed(2)} ms | ${rpsP.toFixed(0)} req/s |`,
      "",
      `Added p50 per request: ${added.toFixed(2)} ms (target ≤ 1 ms). Throughput ratio: ${(100 * ratio).toFixed(1)}% of direct (target ≥ 90%). ${ok ? "Both targets met." : "TARGET MISSED."}`,
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
