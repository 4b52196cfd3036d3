import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { spawn, type ChildProcess } from "node:child_process";
import { connect, headers, type Msg, type NatsConnection } from "@nats-io/transport-node";
import { pino } from "pino";
import {
  HEADER_AUTHORIZATION,
  HEADER_SENT_AT,
  MANIFEST_SCHEMA_VERSION,
  MEMBER_HEARTBEAT_MS,
  NATS_OP_REPLY_PREFIX,
  PREPARE_STAGES,
  PROTOCOL_VERSION,
  RESUME_STAGES,
  formatSentAt,
  participantSubject,
  sha256Hex,
  type CtlReplyOf,
  type Kind,
} from "../protocol/index.js";
import { NatsControllerClient } from "../coordinator/client/nats-controller-client.js";
import { CoordinatorConfigSchema } from "../coordinator/config/coordinator-config.js";
import { startCoordinator, type CoordinatorHandle } from "../coordinator/daemon/coordinator-daemon.js";
import { NatsServerProcess } from "../coordinator/local/nats-server-process.js";
import { openMembersBucket } from "../coordinator/membership/members-bucket.js";
import { CLOCK_TICKS, machine, percentile, writeSection } from "./bench-report.js";

/**
 * A full checkpoint (prepare + commit + publish + resume, empty records) through the coordinator
 * daemon's NATS controller API, against N lightweight participants that answer valid replies at
 * once. In the same run, the floor: the same staged request pattern (4 prepare stages, commit to
 * all, 4 resume stages) issued with bare `nc.request` against the same responders.
 */
const SIZES = (process.env.COORD_BENCH_SIZES ?? "4,64,256").split(",").map(Number);
const ROUNDS: Record<number, number> = { 4: 300, 64: 150, 256: 60 };
const WARMUP = 15;
const TOKEN = "bench-token";
const KINDS: Kind[] = ["environment", "model", "agent", "resources"];
/** Every responder's registry incarnation; the engine names it in each prepare, commit and resume. */
const INCARNATION = "bench";

export interface Member {
  kind: Kind;
  instance: string;
}

function membersFor(n: number): Member[] {
  return Array.from({ length: n }, (_, i) => ({ kind: KINDS[i % 4]!, instance: `p${i}` }));
}

const EMPTY = sha256Hex("");
const REPORT = { ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [] };

/** Lightweight responders: parse the request, answer a schema-valid reply immediately. */
function serve(nc: NatsConnection, deployment: string, members: Member[]): () => void {
  const subs = members.flatMap((m) =>
    (["prepare", "commit", "resume", "status"] as const).map((op) =>
      nc.subscribe(participantSubject(deployment, m.kind, m.instance, op), {
        callback: (_err, msg: Msg) => {
          const body = msg.data.byteLength ? (msg.json() as { checkpoint_id?: string }) : {};
          let reply: unknown;
          switch (op) {
            case "prepare":
              reply = { phase: "prepared", report: REPORT };
              break;
            case "commit":
              reply = {
                phase: "committed",
                manifest: {
                  schema_version: MANIFEST_SCHEMA_VERSION,
                  kind: m.kind,
                  instance: m.instance,
                  checkpoint_id: body.checkpoint_id,
                  records_file: `records-${EMPTY}.jsonl`,
                  records_sha256: EMPTY,
                  record_count: 0,
                  created_at: Date.now() / 1000,
                  extra: {},
                },
                manifest_path: `gym/${m.kind}/${m.instance}/manifest.json`,
                manifest_sha256: EMPTY,
                episode_ids: [],
                extras: {},
              };
              break;
            case "resume":
              reply = { phase: "idle", idempotent: false };
              break;
            case "status":
              reply = {
                kind: m.kind,
                instance: m.instance,
                phase: "idle",
                checkpoint_id: null,
                lease_expires_at: null,
                epoch: 0,
                retired_rollouts: 0,
                report: REPORT,
                protocol_version: PROTOCOL_VERSION,
                extras: {},
              };
          }
          msg.respond(JSON.stringify(reply));
        },
      }),
    ),
  );
  return () => subs.forEach((s) => s.unsubscribe());
}

/**
 * The floor: the same staged pattern of directed requests, nothing else. Its messages are the
 * engine's, field for field: the same bodies (the member's incarnation, the checkpoint's directory
 * under the same root), the same headers (the token and the send time) and replies under the same
 * prefix (the floor's connection takes it as its inbox prefix). Returns its split (ms).
 */
export async function floorRound(world: Pick<World, "fnc" | "deployment" | "members" | "checkpointRoot">, id: string): Promise<{ prepare: number; commit: number; resume: number }> {
  const { fnc, deployment, members } = world;
  const send = (m: Member, op: "prepare" | "commit" | "resume", body: unknown) => {
    const h = headers();
    h.set(HEADER_AUTHORIZATION, `Bearer ${TOKEN}`);
    h.set(HEADER_SENT_AT, formatSentAt(Date.now()));
    return fnc.request(participantSubject(deployment, m.kind, m.instance, op), JSON.stringify(body), { timeout: 10_000, headers: h }).then((r) => r.json());
  };
  const common = { checkpoint_id: id, deadline_ts: Date.now() / 1000 + 60, epoch: 1 };
  const guarded = { ...common, incarnation: INCARNATION };
  const commit = { ...common, checkpoint_dir: join(world.checkpointRoot, id), episode_ids: null, stop: false, incarnation: INCARNATION };
  const t0 = performance.now();
  for (const stage of PREPARE_STAGES) await Promise.all(members.filter((m) => stage.includes(m.kind)).map((m) => send(m, "prepare", guarded)));
  const t1 = performance.now();
  await Promise.all(members.map((m) => send(m, "commit", commit)));
  const t2 = performance.now();
  for (const stage of RESUME_STAGES) await Promise.all(members.filter((m) => stage.includes(m.kind)).map((m) => send(m, "resume", guarded)));
  return { prepare: t1 - t0, commit: t2 - t1, resume: performance.now() - t2 };
}

/**
 * A checkpoint that every member took part in, or an error: one the registry no longer listed (its
 * entry expired, say) would be left out without a refusal, and the checkpoint timed against the
 * floor's N would have fewer participants.
 */
export function assertAllTookPart(world: Pick<World, "members">, reply: CtlReplyOf<"checkpoint">): CtlReplyOf<"checkpoint"> {
  if (reply.participants !== world.members.length || reply.resume_failures.length > 0) {
    throw new Error(`checkpoint ${reply.checkpoint_id} had ${reply.participants} of ${world.members.length} participants (${reply.resume_failures.length} failed to resume): not comparable with the floor`);
  }
  return reply;
}

/** One checkpoint through the controller API, checked to have had every member. */
export async function checkpointRound(world: Pick<World, "client" | "members">, id: string): Promise<CtlReplyOf<"checkpoint">> {
  return assertAllTookPart(world, await world.client.checkpoint({ checkpoint_id: id }));
}

/** CPU time (ms) of this process, user + system, and system alone. */
function ownCpuMs(): { total: number; system: number } {
  const { user, system } = process.cpuUsage();
  return { total: (user + system) / 1000, system: system / 1000 };
}

/** CPU time (ms) of another process from /proc (counted in clock ticks: meaningful over many rounds); NaN where unreadable. */
function processCpuMs(pid: number | undefined): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS;
  } catch {
    return Number.NaN;
  }
}


/** CPU per op (ms) of this process, nats-server and the responders, and the cores they kept busy. */
interface CpuPerOp {
  own: number;
  /** Of `own`, in the kernel (socket writes, file calls, fsyncs). */
  ownSystem: number;
  server: number;
  responders: number;
  /** All three's. */
  total: number;
  /** `total` over the block's wall time per op. */
  cores: number;
}

/**
 * Runs `op` `rounds` times back to back and divides the CPU each process spent by the rounds.
 * A block of its own (not interleaved with the other side), so a checkpoint's background work after
 * its reply (the root's fsync, the journal entry's removal) is charged to checkpoints, not to the
 * floor round that would follow it; the block starts once the previous one's work has settled.
 */
async function cpuBlock(rounds: number, pids: { server: number | undefined; responders: number | undefined }, op: (i: number) => Promise<unknown>): Promise<CpuPerOp> {
  await new Promise((resolve) => setTimeout(resolve, 200));
  const ticks = () => ({ own: ownCpuMs(), server: processCpuMs(pids.server), responders: processCpuMs(pids.responders) });
  const before = ticks();
  const started = performance.now();
  for (let i = 0; i < rounds; i++) await op(i);
  const wall = performance.now() - started;
  const after = ticks();
  const own = after.own.total - before.own.total;
  const server = after.server - before.server;
  const responders = after.responders - before.responders;
  const total = own + server + responders;
  return { own: own / rounds, ownSystem: (after.own.system - before.own.system) / rounds, server: server / rounds, responders: responders / rounds, total: total / rounds, cores: total / wall };
}

/** Runs the responders for `members` in a child process (as real participants would be), until killed. */
async function spawnResponders(url: string, deployment: string, n: number): Promise<ChildProcess> {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url)], {
    env: { ...process.env, COORD_BENCH_ROLE: "responders", COORD_BENCH_URL: url, COORD_BENCH_DEPLOYMENT: deployment, COORD_BENCH_N: String(n) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once("data", () => resolve());
    child.once("exit", (code) => reject(new Error(`responders exited (${code})`)));
  });
  return child;
}

async function respondersMain(): Promise<void> {
  const nc = await connect({ servers: process.env.COORD_BENCH_URL! });
  const deployment = process.env.COORD_BENCH_DEPLOYMENT!;
  const members = membersFor(Number(process.env.COORD_BENCH_N));
  serve(nc, deployment, members);
  await nc.flush();
  // Their registry entries, renewed every MEMBER_HEARTBEAT_MS as participants renew theirs, from
  // their own process: the registry drops an entry MEMBER_TTL_MS after its last renewal, and a
  // checkpoint then goes ahead without that member (assertAllTookPart stops the run instead).
  const kv = await openMembersBucket(nc, deployment);
  const startedAt = Date.now() / 1000;
  const heartbeat = async () => {
    const now = Date.now() / 1000;
    for (const m of members) {
      await kv.put(`${m.kind}.${m.instance}`, JSON.stringify({ ...m, incarnation: INCARNATION, started_at: startedAt, heartbeat_at: now, protocol_version: PROTOCOL_VERSION }));
    }
  };
  await heartbeat();
  const renew = (): unknown => setTimeout(() => void heartbeat().then(renew, (error: unknown) => console.error("responders: heartbeat failed", error)), MEMBER_HEARTBEAT_MS);
  renew();
  process.stdout.write("ready\n");
  process.once("SIGTERM", () => void nc.close().then(() => process.exit(0)));
}

/** One size's setup: responders, their registry entries (renewed as participants renew theirs), a coordinator daemon, and the two client connections. */
export interface World {
  deployment: string;
  members: Member[];
  /** The coordinator's checkpoint root. */
  checkpointRoot: string;
  coordinator: CoordinatorHandle;
  /** The controller client (checkpoints) and the floor's connection. */
  client: NatsControllerClient;
  fnc: NatsConnection;
  responders: ChildProcess;
  close(): Promise<void>;
}

export async function startWorld(url: string, checkpointRoot: string, deployment: string, n: number): Promise<World> {
  const members = membersFor(n);
  // Whatever started is stopped again if a later step fails.
  const undo: (() => Promise<unknown>)[] = [];
  const close = async () => {
    for (const step of undo.reverse()) await step().catch(() => undefined);
  };
  try {
    const cnc = await connect({ servers: url, noAsyncTraces: true });
    undo.push(() => cnc.close());
    // The coordinator's participant replies come under NATS_OP_REPLY_PREFIX: the floor's do too.
    const fnc = await connect({ servers: url, noAsyncTraces: true, inboxPrefix: NATS_OP_REPLY_PREFIX });
    undo.push(() => fnc.close());
    const respondersStarting = spawnResponders(url, deployment, n);
    undo.push(async () => (await respondersStarting.catch(() => undefined))?.kill("SIGTERM"));
    const responders = await respondersStarting;
    const config = CoordinatorConfigSchema.parse({
      deployment,
      nats: { servers: url },
      token: TOKEN,
      checkpoint_root: checkpointRoot,
      lease_ms: 1000,
      http: { enabled: false, host: "127.0.0.1", port: 0 },
      log_level: "silent",
    });
    // (the daemon connects with noAsyncTraces, like the floor connection)
    const coordinator = await startCoordinator({ config, logger: pino({ level: "silent" }) });
    undo.push(() => coordinator.stop());
    await coordinator.whenReady();
    const client = new NatsControllerClient({ nc: cnc, deployment, token: TOKEN });
    return { deployment, members, checkpointRoot, coordinator, client, fnc, responders, close };
  } catch (error) {
    await close();
    throw error;
  }
}

export async function run(): Promise<void> {
  const server = await NatsServerProcess.start();
  const root = await mkdtemp(join(tmpdir(), "gym-ckpt-bench-coord-"));
  const rows: string[] = [];
  const cpuRows: string[] = [];
  const results: { split: string; floorSplit: string; inside: Record<"prepare" | "commit" | "publish" | "resume", number>; outside: number; tail: number; floorInside: Record<"prepare" | "commit" | "resume", number>; n: number; p50: number; p99: number; f50: number; f99: number; ratio: number; cpu: { checkpoint: CpuPerOp; floor: CpuPerOp } }[] = [];
  try {
    for (const n of SIZES) {
      const world = await startWorld(server.url, join(root, `bench${n}`), `bench${n}`, n);
      try {
        const rounds = ROUNDS[n] ?? 50;
        const full: number[] = [];
        const parts = { prepare: [] as number[], commit: [] as number[], publish: [] as number[], resume: [] as number[] };
        // Per round: the longer of publication and resume (they overlap).
        const tails: number[] = [];
        /** Per round, the checkpoint's time beyond the coordinator's own time for its phases. */
        const outside: number[] = [];
        const floor: number[] = [];
        const floorParts = { prepare: [] as number[], commit: [] as number[], resume: [] as number[] };
        // Interleave the two so both see the same machine state.
        for (let i = 0; i < rounds + WARMUP; i++) {
          let t = performance.now();
          const reply = await checkpointRound(world, `c${n}-${i}`);
          const a = performance.now() - t;
          if (i >= WARMUP) {
            const timings = reply.timings_ms;
            for (const k of ["prepare", "commit", "publish", "resume"] as const) parts[k].push(timings[k]);
            tails.push(Math.max(timings.publish, timings.resume));
            outside.push(a - (timings.prepare + timings.commit + Math.max(timings.publish, timings.resume)));
          }
          t = performance.now();
          const floorSplit = await floorRound(world, `f${n}-${i}`);
          const b = performance.now() - t;
          if (i >= WARMUP) {
            for (const k of ["prepare", "commit", "resume"] as const) floorParts[k].push(floorSplit[k]);
            full.push(a);
            floor.push(b);
          }
        }
        // CPU per op, in blocks of their own after the latency rounds.
        const pids = { server: server.pid, responders: world.responders.pid };
        const cpuRounds = Math.min(rounds, 100);
        const cpu = {
          checkpoint: await cpuBlock(cpuRounds, pids, (i) => checkpointRound(world, `cpu${n}-${i}`)),
          floor: await cpuBlock(cpuRounds, pids, (i) => floorRound(world, `cpuf${n}-${i}`)),
        };
        const medians = <K extends string>(byPart: Record<K, number[]>) => Object.fromEntries(Object.entries<number[]>(byPart).map(([k, v]) => [k, percentile(v, 50)])) as Record<K, number>;
        const inside = medians(parts);
        const floorInside = medians(floorParts);
        const splitOf = (m: Record<string, number>) => Object.entries(m).map(([k, v]) => `${k} ${v.toFixed(1)}`).join(", ");
        const split = splitOf(inside);
        const floorSplit = splitOf(floorInside);
        const r = { split, floorSplit, inside, outside: percentile(outside, 50), tail: percentile(tails, 50), floorInside, n, p50: percentile(full, 50), p99: percentile(full, 99), f50: percentile(floor, 50), f99: percentile(floor, 99), ratio: 0, cpu };
        r.ratio = r.p50 / r.f50;
        results.push(r);
        console.log(`${n} participants: checkpoint p50 ${r.p50.toFixed(2)} ms p99 ${r.p99.toFixed(2)} ms | floor p50 ${r.f50.toFixed(2)} ms p99 ${r.f99.toFixed(2)} ms | ratio ${r.ratio.toFixed(2)}× | inside the coordinator (p50 ms): ${split} | floor: ${floorSplit}`);
        rows.push(`| ${n} | ${r.p50.toFixed(2)} | ${r.p99.toFixed(2)} | ${r.f50.toFixed(2)} | ${r.f99.toFixed(2)} | ${r.ratio.toFixed(2)}× | ${split} | ${floorSplit} |`);
        const { checkpoint: cc, floor: fc } = r.cpu;
        const pair = (a: number, b: number) => `${a.toFixed(2)} / ${b.toFixed(2)}`;
        cpuRows.push(`| ${n} | ${pair(cc.own, fc.own)} (system ${pair(cc.ownSystem, fc.ownSystem)}) | ${pair(cc.server, fc.server)} | ${pair(cc.responders, fc.responders)} | ${pair(cc.total, fc.total)} | ${cc.cores.toFixed(1)} / ${fc.cores.toFixed(1)} |`);
      } finally {
        await world.close();
      }
    }
  } finally {
    await server.dispose();
    await rm(root, { recursive: true, force: true });
  }
  const r64 = results.find((r) => r.n === 64);
  // The costs the floor does not pay, read off the smallest size (they do not grow with N).
  const smallest = results[0];
  const fixed = smallest
    ? (() => {
        const { inside, outside, tail, floorInside } = smallest;
        const { checkpoint: cc, floor: fc } = smallest.cpu;
        const cpuNote = ` Both sides keep the machine's cores busy (all three processes' CPU over the block's wall time: ${cc.cores.toFixed(1)} cores during the checkpoints, ${fc.cores.toFixed(1)} during the floor rounds, of 2), so their latency follows the CPU they spend, and the checkpoint spends ${(cc.total / fc.total).toFixed(1)}× the floor's: most of the difference is in the benchmark process (the controller request and reply, the KV writes' client side, the staging and publication's file calls, the per-request work) and nats-server (the acknowledged KV writes and the controller hop).`;
        return `In this run, at ${smallest.n} participants: the controller request ≈ ${outside.toFixed(1)} ms (per round, the checkpoint's time minus the coordinator's own time for its phases, prepare + commit + the longer of publication and resume, which overlap; median over the rounds; it includes the op's work outside those phases, such as retention before the reply; an op sent without \`deadline_ts\` also has the client read the leader lease beside it, once per 100 ms: ops this close share one read), the publication ${inside.publish.toFixed(1)} ms (beside the resume's ${inside.resume.toFixed(1)} ms), the commit decision's KV write ≈ ${(inside.commit - floorInside.commit).toFixed(1)} ms (commit beyond the floor's), the journal entry, staging and per-stage work ≈ ${(inside.prepare - floorInside.prepare + tail - floorInside.resume).toFixed(1)} ms (prepare, and the longer of publication and resume, beyond the floor's prepare and resume).${cpuNote}`;
      })()
    : "";
  const met = results.filter((r) => r.ratio <= 1.5).map((r) => r.n);
  const missed = results.filter((r) => r.ratio > 1.5).map((r) => `${r.n} (${r.ratio.toFixed(2)}×)`);
  const verdict = `Verdict: ratio ≤ 1.5× ${met.length ? `met at ${met.join(", ")} participants` : "met at no size"}${missed.length ? `, missed at ${missed.join(", ")}` : ""}; 64-participant p50 < 15 ms ${r64 ? (r64.p50 < 15 ? "met" : "missed") : "not measured"}.`;
  await writeSection(
    "coordinator",
    `## Coordinator: full checkpoint vs raw NATS request floor

Machine: ${machine()}. Command: \`npm run bench -- coordinator-checkpoint\` (sizes via \`COORD_BENCH_SIZES\`). nats-server 2.9 on 127.0.0.1.
A full checkpoint = the \`checkpoint\` controller op over NATS (client → daemon → reply): prepare in 4 stages, the journal entry written beside the first and acknowledged before the second → journal(decided) → commit to all, while LATEST's temp file is written and fsynced → side by side: the resume in 4 stages, and checkpoint.json (temp file, rename; its fsync and the directory's wait in the thread pool) → LATEST renamed (the one it replaces kept by a link in the trash, so the rename frees no inode; that link and the root's fsync go in the background; the journal entry stays until it is done) → retention (old checkpoints renamed away; their files are removed in the background). Participants are lightweight responders (empty records) in a separate Node process, as participants would be, which also renews their registry entries every 5 s as participants do (every checkpoint is checked to have had all N: one the registry stopped listing would be left out without a refusal, and the run stops instead); the coordinator daemon and the floor client share the benchmark process, and one nats-server serves both. The floor is the same staged pattern (4 prepare stages, commit to all, 4 resume stages) as bare \`nc.request\` calls to the same responders, with the engine's messages (the same body fields, the member's incarnation and the checkpoint directory under the same root included, the same headers, replies under the same prefix), on a connection with the same options, interleaved round by round with the checkpoints. The machine is shared (load average ${loadavg()[0]!.toFixed(1)} at the end of the run), so p99s are noisy; ratios are side by side.

| participants | checkpoint p50 (ms) | p99 (ms) | floor p50 (ms) | floor p99 (ms) | ratio p50 | split inside the coordinator, p50 (ms; publish and resume overlap) | floor split, p50 (ms) |
| --- | --- | --- | --- | --- | --- | --- | --- |
${rows.join("\n")}

CPU per op (ms; checkpoint / floor), measured after the latency rounds in a block of up to 100 checkpoints back to back and then one of as many floor rounds, so each side pays for its own background work: the benchmark process (the coordinator daemon, its controller client and the floor's client; of it, the time in the kernel: socket writes, file calls, fsyncs), nats-server, and the responders' process (read from /proc in clock ticks, ${1000 / CLOCK_TICKS} ms each, summed over the block), and the cores all three kept busy over the block's wall time:

| participants | benchmark process | nats-server | responders | all three | cores busy |
| --- | --- | --- | --- | --- | --- |
${cpuRows.join("\n")}

Targets: ratio ≤ 1.5× the floor; 64-participant p50 < 15 ms${r64 ? ` (measured ${r64.p50.toFixed(2)} ms)` : ""}.
What the floor does not pay, per checkpoint and independent of N: the controller request itself (two NATS hops and the reply), acknowledged KV writes (the journal entry, of which only what outlasts the first prepare stage shows, and the commit decision, which must be durable before the first commit leaves) and the durable publication (one fsynced file and one directory fsync, overlapping the resume: \`publish\` and \`resume\` in the split both count from the end of the commit). ${fixed} Those fixed costs are most of a small checkpoint, which is why the ratio is highest there; the per-participant cost inside the coordinator is at or below the floor's (its requests share one reply subscription and build no Error per request, unlike \`nc.request\`), which is why the ratio falls as N grows. What each fixed cost adds at 4 participants is measured in the next section (\`coordinator-fixed-costs\`).

${verdict}`,
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  if (process.env.COORD_BENCH_ROLE === "responders") await respondersMain();
  else await run();
}
