import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startPrometheus, type PrometheusProcess } from "../support/prometheus.js";

/**
 * docs/telemetry.md's panel and alert queries, run by a real Prometheus against what a deployment
 * with two coordinators looks like after a change of leader: both have published (each its own
 * `gym_ckpt_coordinator_published_total` series, kept by the standby), the participants wrote
 * bytes. The targets serve fixed exposition text whose counters grow at every scrape (the e2e
 * telemetry tests read the real exporters' names). A query must be valid PromQL and yield no NaN:
 * `scalar()` of a per-coordinator counter does, unless it is aggregated first.
 */
const TELEMETRY = readFileSync(fileURLToPath(new URL("../../docs/telemetry.md", import.meta.url)), "utf8");

/** Panel name → its PromQL code spans, from "Panels to watch" (the alert sentence under "alerts"). */
function panelQueries(): Map<string, string[]> {
  const section = TELEMETRY.slice(TELEMETRY.indexOf("## Panels to watch"), TELEMETRY.indexOf("## Testing"));
  const spans = (text: string) => [...text.matchAll(/`([^`]*gym_ckpt_[^`]*)`/g)].map((m) => m[1]!);
  const panels = new Map<string, string[]>();
  for (const line of section.split("\n")) {
    const row = /^\| ([^|`]+) \| (.*) \|$/.exec(line);
    if (row && spans(row[2]!).length) panels.set(row[1]!.trim(), spans(row[2]!));
    else if (!line.startsWith("|")) panels.set("alerts", [...(panels.get("alerts") ?? []), ...spans(line)]);
  }
  return panels;
}

let prometheus: PrometheusProcess | undefined;
const servers: Server[] = [];

/** A /metrics endpoint whose text is rebuilt at each scrape (`n` = scrapes so far). */
async function target(text: (n: number) => string): Promise<string> {
  let n = 0;
  const server = createServer((req, res) => {
    n++;
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4" }).end(text(n));
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `127.0.0.1:${(server.address() as AddressInfo).port}`;
}

const coordinator = (leader: boolean, published: number) => (n: number) =>
  [
    "# TYPE gym_ckpt_coordinator_published_total counter",
    `gym_ckpt_coordinator_published_total ${published + n}`,
    "# TYPE gym_ckpt_coordinator_leader gauge",
    `gym_ckpt_coordinator_leader ${leader ? 1 : 0}`,
    "# TYPE gym_ckpt_coordinator_leader_epoch gauge",
    `gym_ckpt_coordinator_leader_epoch ${leader ? 7 : 0}`,
    "",
  ].join("\n");

beforeAll(async () => {
  const participant = (n: number) =>
    [
      "# TYPE gym_ckpt_bytes_total counter",
      `gym_ckpt_bytes_total{op="commit",kind="environment"} ${4096 * n}`,
      `gym_ckpt_bytes_total{op="commit",kind="agent"} ${1024 * n}`,
      "# TYPE gym_ckpt_participant_clock_offset gauge",
      'gym_ckpt_participant_clock_offset{kind="environment",participant="env0"} -2.5',
      'gym_ckpt_participant_clock_offset{kind="agent",participant="agent0"} 0.01',
      "",
    ].join("\n");
  prometheus = await startPrometheus([
    { job: "coordinator", address: await target(coordinator(false, 3)) }, // the former leader
    { job: "coordinator", address: await target(coordinator(true, 1)) },
    { job: "gym", address: await target(participant) },
  ]);
});

afterAll(async () => {
  await prometheus?.close();
  await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
});

describe("docs/telemetry.md panels with two coordinators", () => {
  it("every panel and alert query is valid and yields no NaN; bytes per checkpoint is a number per kind", async () => {
    const p = prometheus!;
    // Both coordinators' counters and the bytes have grown over at least two scrapes each.
    await p.waitFor("increase(gym_ckpt_coordinator_published_total[1h]) > 0", 20_000, (r) => r.length === 2);
    await p.waitFor('increase(gym_ckpt_bytes_total{op="commit"}[1h]) > 0', 20_000, (r) => r.length === 2);
    const panels = panelQueries();
    expect(panels.get("alerts")?.length).toBeGreaterThan(0);
    for (const [panel, queries] of panels) {
      for (const query of queries) {
        const result = await p.query(query);
        expect(result.filter((r) => Number.isNaN(Number(r.value[1]))), `${panel}: ${query}`).toEqual([]);
      }
    }
    const [bytesQuery] = panels.get("Bytes written per checkpoint")!;
    const perKind = await p.query(bytesQuery!);
    expect(perKind.map((r) => r.metric.kind).sort()).toEqual(["agent", "environment"]);
    for (const r of perKind) expect(Number.isFinite(Number(r.value[1])), `${r.metric.kind}: ${r.value[1]}`).toBe(true);
    // A clock behind counts as much as one ahead: the panel shows its size, the alert fires on it.
    const [offsetQuery] = panels.get("Clock offset per participant (s, should stay under 1)")!;
    const offsets = Object.fromEntries((await p.query(offsetQuery!)).map((r) => [r.metric.participant, Number(r.value[1])]));
    expect(offsets).toEqual({ env0: 2.5, agent0: 0.01 });
    expect(await p.query(panels.get("alerts")!.find((q) => q.includes("clock_offset"))!)).toHaveLength(1);
  });
});
