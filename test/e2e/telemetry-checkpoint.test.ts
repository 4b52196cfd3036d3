import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { launchGym, type Gym, type GymProcessName } from "../../participants/gym/gym-launcher.js";
import { TASK } from "../support/gym-processes.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startOtlpReceiver, type OtlpReceiver, type ReceivedSpan } from "../support/otlp-receiver.js";
import { startPrometheus, type PrometheusProcess } from "../support/prometheus.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * One checkpoint across real processes: the coordinator daemon and the reference Gym (policy
 * backend, model attach proxy, resources, agent, environment) export OTLP/HTTP JSON to a local
 * receiver and serve Prometheus /metrics, which a real Prometheus (Debian's) scrapes.
 */
const TOKEN = "telemetry-e2e-token";
const CONTROLLER_TOKEN = "telemetry-e2e-controller";
const ID = "tele-ckpt-1";
const PARTICIPANTS: Exclude<GymProcessName, "policy">[] = ["model", "resources", "agent", "environment"];

let receiver: OtlpReceiver;
let nats: NatsFixture;
let root: string;
let daemon: DaemonProcess | undefined;
let gym: Gym | undefined;
let prometheus: PrometheusProcess | undefined;
let client: NatsControllerClient;
const metricsUrls = new Map<string, string>();
const deployment = `tele${process.pid}`;

async function waitFor<T>(what: string, probe: () => T | undefined | Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const hostPort = (url: string) => new URL(url).host;

beforeAll(async () => {
  ensureBuilt();
  receiver = await startOtlpReceiver();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-tele-"));
  const env = {
    OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
    OTEL_BSP_SCHEDULE_DELAY: "100",
    OTEL_METRIC_EXPORT_INTERVAL: "1000",
    OTEL_SERVICE_NAME: "",
  };
  daemon = spawnDaemon(
    [
      MAIN,
      "coordinator",
      "--deployment",
      deployment,
      "--nats-url",
      nats.server.url,
      "--token",
      TOKEN,
      "--controller-token",
      CONTROLLER_TOKEN,
      "--checkpoint-root",
      root,
      "--lease-ms",
      "500",
      "--no-http",
      "--log-level",
      "info",
      "--coordinator-id",
      "coord-a",
      "--metrics-port",
      "0",
    ],
    env,
  );
  const d = daemon;
  metricsUrls.set("coordinator", await waitFor("the coordinator's metrics line", () => /^metrics (\S+)$/m.exec(d.stdout())?.[1]));
  gym = await launchGym({
    nats: nats.server.url,
    deployment,
    token: TOKEN,
    checkpointRoot: root,
    leaseGraceSeconds: 120,
    env,
    readyTimeoutMs: 30_000,
    args: Object.fromEntries(PARTICIPANTS.map((name) => [name, ["--metrics-port", "0"]])),
    onOutput: (name, line) => {
      if (!line.startsWith('{"ready"')) return;
      const ready = JSON.parse(line) as { metrics_url?: string };
      if (ready.metrics_url) metricsUrls.set(name, ready.metrics_url);
    },
  });
  prometheus = await startPrometheus([...metricsUrls].map(([job, url]) => ({ job, address: hostPort(url) })));
  client = new NatsControllerClient({ nc: await nats.connect(), deployment, token: CONTROLLER_TOKEN, leaderWaitMs: 15_000 });
  // Every participant announced and seen by the leader.
  await waitFor("four participants in the coordinator's status", async () => ((await client.status()).participants.length === 4 ? true : undefined));
}, 90_000);

afterAll(async () => {
  await gym?.stop().catch(() => undefined);
  await daemon?.kill("SIGTERM").catch(() => undefined);
  await prometheus?.close().catch(() => undefined);
  await nats?.close().catch(() => undefined);
  await receiver?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
});

describe("telemetry across processes", () => {
  it("serves Prometheus /metrics on every participant and the coordinator", () => {
    expect([...metricsUrls.keys()].sort()).toEqual(["agent", "coordinator", "environment", "model", "resources"]);
    for (const url of metricsUrls.values()) expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
  });

  it("one checkpoint is one trace: coordinator op → stage → participant request → participant op → children", async () => {
    // Data plane first: the environment's request to the agent carries its trace context.
    const run = await fetch(`${gym!.urls.environment!.replace(/\/+$/, "")}/run`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rollout_id: "tele-run-1", attempt: 0, task: TASK }),
    });
    expect(run.status).toBe(200);
    const reply = await client.checkpoint({ checkpoint_id: ID, episode_ids: [{ rollout_id: "tele-run-1", attempt: 0 }] });
    expect(reply.checkpoint_id).toBe(ID);
    expect(reply.participants).toBe(4);

    const resumeSpans = () => receiver.spans().filter((s) => s.name === "checkpoint.resume" && s.attributes["gym_ckpt.checkpoint.id"] === ID);
    const spans = await waitFor("participant resume spans of every participant", () => {
      const root = receiver.spans().find((s) => s.name === "checkpoint.coordinate.checkpoint");
      return root && resumeSpans().length === 4 ? receiver.spans() : undefined;
    });
    const root = spans.find((s) => s.name === "checkpoint.coordinate.checkpoint")!;
    expect(root.service).toBe("gym-ckpt-coordinator");
    expect(root.parentSpanId).toBeUndefined();
    expect(root.attributes["gym_ckpt.checkpoint.id"]).toBe(ID);
    const trace = spans.filter((s) => s.traceId === root.traceId);
    const byId = new Map(trace.map((s) => [s.spanId, s]));
    const parentOf = (s: ReceivedSpan) => (s.parentSpanId ? byId.get(s.parentSpanId) : undefined);

    // Every span that names this checkpoint, in every process, is in the one trace.
    const named = spans.filter((s) => s.attributes["gym_ckpt.checkpoint.id"] === ID);
    expect(new Set(named.map((s) => s.traceId))).toEqual(new Set([root.traceId]));
    expect(new Set(trace.map((s) => s.service))).toEqual(
      new Set(["gym-ckpt-coordinator", "gym-ckpt-attach-model", "gym-ckpt-resources-server", "gym-ckpt-agent-server", "gym-ckpt-environment-server"]),
    );

    // Coordinator: stages under the op, participant requests under the stages.
    const stages = trace.filter((s) => s.name.startsWith("checkpoint.coordinate.prepare.stage."));
    expect(stages.length).toBeGreaterThan(0);
    for (const stage of stages) expect(stage.parentSpanId).toBe(root.spanId);

    for (const op of ["prepare", "commit", "resume"] as const) {
      const participantOps = trace.filter((s) => s.name === `checkpoint.${op}`);
      expect(participantOps.map((s) => s.attributes["gym_ckpt.participant.kind"]).sort()).toEqual(["agent", "environment", "model", "resources"]);
      for (const span of participantOps) {
        expect(span.service).not.toBe("gym-ckpt-coordinator");
        expect(span.attributes["gym_ckpt.checkpoint.id"]).toBe(ID);
        expect(typeof span.attributes["gym_ckpt.epoch"]).toBe("number");
        // Parent: the coordinator's request to this very participant.
        const request = parentOf(span)!;
        expect(request.name).toBe(`checkpoint.participant.${op}`);
        expect(request.service).toBe("gym-ckpt-coordinator");
        expect(request.attributes["gym_ckpt.participant.instance"]).toBe(span.attributes["gym_ckpt.participant.instance"]);
        // ... which hangs (through its stage span, if any) under the op span.
        let up = parentOf(request);
        while (up && up.spanId !== root.spanId) up = parentOf(up);
        expect(up?.spanId).toBe(root.spanId);
        const children = trace.filter((s) => s.parentSpanId === span.spanId).map((s) => s.name);
        if (op === "prepare") expect(children).toEqual(["wait_ready"]);
        if (op === "commit") expect(children.sort()).toEqual(["export", "write"]);
      }
    }
    const writes = trace.filter((s) => s.name === "write");
    expect(writes).toHaveLength(4);
    for (const w of writes) {
      expect(typeof w.attributes["gym_ckpt.records"]).toBe("number");
      expect(typeof w.attributes["gym_ckpt.bytes"]).toBe("number");
    }
    // Only the model participant holds the finished episode (its capture ledger row).
    const modelWrite = writes.find((w) => w.attributes["gym_ckpt.participant.kind"] === "model")!;
    expect(modelWrite.attributes["gym_ckpt.records"]).toBe(1);
    expect(modelWrite.attributes["gym_ckpt.bytes"]).toBeGreaterThan(0);
    expect(trace.find((s) => s.name === "checkpoint.commit" && s.attributes["gym_ckpt.participant.kind"] === "model")!.attributes["gym_ckpt.records"]).toBe(1);
    // No token or key ever lands in an attribute.
    for (const s of spans) for (const [k, v] of Object.entries(s.attributes)) expect(`${k}=${String(v)}`).not.toMatch(/token|telemetry-e2e/i);

    // The data-plane request: the agent's server span is a child in the environment's /run trace.
    const runSpan = spans.find((s) => s.service === "gym-ckpt-environment-server" && s.name === "POST /run")!;
    expect(runSpan).toBeDefined();
    const agentSide = spans.filter((s) => s.service === "gym-ckpt-agent-server" && s.traceId === runSpan.traceId && s.kind === 2);
    expect(agentSide.length).toBeGreaterThan(0);
    expect(runSpan.traceId).not.toBe(root.traceId);
    // Log correlation: the coordinator's log lines about this checkpoint carry the trace id.
    const correlated = daemon!
      .stdout()
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as { checkpoint_id?: string; trace_id?: string; span_id?: string })
      .filter((l) => l.checkpoint_id === ID);
    expect(correlated.length).toBeGreaterThan(0);
    for (const line of correlated) expect(line.trace_id).toBe(root.traceId);
    expect(trace.some((s) => s.spanId === correlated[0]!.span_id)).toBe(true);
  });

  it("Prometheus reads the checkpoint duration and participant metrics back from its scrapes", async () => {
    const p = prometheus!;
    const duration = await p.waitFor('gym_ckpt_coordinator_op_duration_count{job="coordinator",op="checkpoint",outcome="ok"}', 20_000);
    expect(Number(duration[0]!.value[1])).toBeGreaterThanOrEqual(1);
    const jobs = (r: { metric: Record<string, string> }[]) => [...new Set(r.map((x) => x.metric.job))].sort().join(",");
    const commits = await p.waitFor('gym_ckpt_participant_op_duration_count{op="commit",outcome="ok"}', 20_000, (r) => jobs(r) === "agent,environment,model,resources");
    expect(new Set(commits.map((r) => r.metric.job))).toEqual(new Set(PARTICIPANTS));
    const written = await p.waitFor('sum by (kind) (gym_ckpt_records_total{op="commit"})', 20_000, (r) => r.length === 4);
    expect(written.map((r) => r.metric.kind).sort()).toEqual(["agent", "environment", "model", "resources"]);
    const pauses = await p.waitFor("gym_ckpt_participant_pause_duration_count", 20_000, (r) => r.length === 4);
    expect(pauses.map((r) => r.metric.participant).sort()).toEqual(["agent", "environment", "policy_model", "resources"]);
    const epoch = await p.waitFor('gym_ckpt_coordinator_leader_epoch{job="coordinator"}', 20_000);
    expect(Number(epoch[0]!.value[1])).toBeGreaterThan(0);
    const held = await p.waitFor('gym_ckpt_participant_state{kind="model",name="held"}', 20_000);
    expect(Number(held[0]!.value[1])).toBe(0);
    const up = await p.targets();
    expect(up.map((t) => t.health)).toEqual(up.map(() => "up"));
  });
});
