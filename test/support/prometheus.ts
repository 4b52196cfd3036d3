import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** Debian's package (`apt-get install prometheus`; test/support/prepare-env.sh installs it as root). */
export const PROMETHEUS_BINARY = "/usr/bin/prometheus";

export interface PrometheusTarget {
  job: string;
  /** host:port of a /metrics endpoint. */
  address: string;
}

export interface PrometheusProcess {
  url: string;
  /** Instant query through the HTTP API; the `result` vector. */
  query(promql: string): Promise<{ metric: Record<string, string>; value: [number, string] }[]>;
  /** Polls `query` until it returns a non-empty vector that `accept` (if given) accepts (bounded). */
  waitFor(
    promql: string,
    timeoutMs?: number,
    accept?: (result: { metric: Record<string, string>; value: [number, string] }[]) => boolean,
  ): Promise<{ metric: Record<string, string>; value: [number, string] }[]>;
  /** Scrape health of each target (`up`). */
  targets(): Promise<{ job: string; health: string; lastError: string }[]>;
  close(): Promise<void>;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

/**
 * A real Prometheus on 127.0.0.1 (free port) with a temp config and storage directory, scraping
 * the given targets every second. `close()` kills it and removes the directory.
 */
export async function startPrometheus(scrape: PrometheusTarget[], options: { readyTimeoutMs?: number } = {}): Promise<PrometheusProcess> {
  if (!existsSync(PROMETHEUS_BINARY)) throw new Error(`${PROMETHEUS_BINARY} is missing: run \`apt-get install -y prometheus\` (test/support/prepare-env.sh does it as root)`);
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-prom-"));
  const jobs = new Map<string, string[]>();
  for (const t of scrape) jobs.set(t.job, [...(jobs.get(t.job) ?? []), t.address]);
  const config = [
    "global:",
    "  scrape_interval: 1s",
    "  scrape_timeout: 900ms",
    "  evaluation_interval: 1s",
    "scrape_configs:",
    ...[...jobs].flatMap(([job, addresses]) => [`  - job_name: ${JSON.stringify(job)}`, "    static_configs:", `      - targets: ${JSON.stringify(addresses)}`]),
    "",
  ].join("\n");
  await writeFile(join(dir, "prometheus.yml"), config);
  const port = await freePort();
  const child: ChildProcess = spawn(
    PROMETHEUS_BINARY,
    [
      `--config.file=${join(dir, "prometheus.yml")}`,
      `--storage.tsdb.path=${join(dir, "data")}`,
      `--web.listen-address=127.0.0.1:${port}`,
      "--storage.tsdb.retention.time=1h",
      "--log.level=warn",
    ],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const url = `http://127.0.0.1:${port}`;
  const close = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
    await rm(dir, { recursive: true, force: true });
  };
  const api = async <T>(path: string): Promise<T> => {
    const response = await fetch(`${url}${path}`);
    const body = (await response.json()) as { status: string; data: T; error?: string };
    if (body.status !== "success") throw new Error(`prometheus ${path}: ${body.error ?? response.status}`);
    return body.data;
  };
  const query: PrometheusProcess["query"] = async (promql) =>
    (await api<{ result: { metric: Record<string, string>; value: [number, string] }[] }>(`/api/v1/query?query=${encodeURIComponent(promql)}`)).result;
  try {
    const until = Date.now() + (options.readyTimeoutMs ?? 20_000);
    for (;;) {
      if (child.exitCode !== null) throw new Error(`prometheus exited: ${stderr}`);
      const ready = await fetch(`${url}/-/ready`).then((r) => r.ok, () => false);
      if (ready) break;
      if (Date.now() > until) throw new Error(`prometheus was not ready in time: ${stderr}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  } catch (error) {
    await close();
    throw error;
  }
  const targetHealth: PrometheusProcess["targets"] = async () => {
    const data = await api<{ activeTargets: { labels: { job: string }; health: string; lastError: string }[] }>("/api/v1/targets");
    return data.activeTargets.map((t) => ({ job: t.labels.job, health: t.health, lastError: t.lastError }));
  };
  return {
    url,
    query,
    targets: targetHealth,
    async waitFor(promql, timeoutMs = 20_000, accept = () => true) {
      const until = Date.now() + timeoutMs;
      for (;;) {
        const result = await query(promql);
        if (result.length > 0 && accept(result)) return result;
        if (Date.now() > until) {
          throw new Error(`prometheus: no accepted result for ${promql} within ${timeoutMs} ms (last: ${JSON.stringify(result)}); targets: ${JSON.stringify(await targetHealth())}`);
        }
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
    },
    close,
  };
}
