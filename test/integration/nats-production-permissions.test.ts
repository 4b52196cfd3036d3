import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { controllerSubject, journalBucket, leaderBucket, NATS_INBOX_PREFIXES, participantSubject } from "../../protocol/index.js";
import { ensureBuilt, MAIN } from "../e2e/coordinator-process.js";
import { NatsServerProcess } from "../support/nats.js";
import { descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * deploy/nats/nats-server.production.conf's permission blocks on a real nats-server, made single
 * node (no cluster block, no sync_interval: 2.9, ports and store chosen here): the coordinator
 * daemon, `gym-ckpt gym` and the CLI each work as their role's user, the gym and controller
 * users are refused writing the leader lease and the decision journal, and the gym user reading
 * the replies the coordinator and the controllers receive.
 */
const CONF = fileURLToPath(new URL("../../deploy/nats/nats-server.production.conf", import.meta.url));
const DEPLOYMENT = "default"; // the name the production permissions are written for
const PASSWORDS = { coordinator: "coord-pw", gym: "gym-pw", controller: "ctl-pw" } as const;
type Role = keyof typeof PASSWORDS;
const TOKEN = "perm-token";
const CONTROLLER_TOKEN = "perm-ctl-token";

let dir: string;
let server: NatsServerProcess;
const spawned: ChildProcess[] = [];
const seen = new TrackedProcesses();
const connections: NatsConnection[] = [];
/** The daemons the first test starts; the second attacks them. */
let coordinatorRun: { child: ChildProcess; out: () => string } | undefined;
let gymRun: { child: ChildProcess; out: () => string } | undefined;

/** The production file with only what a single local node needs changed. */
function singleNodeConfig(production: string): string {
  const config = production
    .replace(/^cluster \{[\s\S]*?^\}\n/m, "")
    .replace(/^\s*sync_interval:.*\n/m, "")
    .replace(/^(port|http_port):.*\n/gm, "") // the fixture passes -p; no monitoring port
    .replace(/^\s*store_dir:.*\n/m, ""); // the fixture passes -sd, its own temp store
  expect(config).not.toMatch(/^\s*(cluster|sync_interval|store_dir)\b/m);
  return config;
}

function env(role: Role): NodeJS.ProcessEnv {
  return { ...process.env, GYM_CKPT_NATS_URL: server.url, GYM_CKPT_NATS_USER: role, GYM_CKPT_NATS_PASS: PASSWORDS[role], GYM_CKPT_NATS_TOKEN: "" };
}

function start(role: Role, args: string[]): { child: ChildProcess; out: () => string } {
  const child = spawn(process.execPath, [MAIN, ...args], { env: env(role), stdio: ["ignore", "pipe", "pipe"] });
  spawned.push(child);
  seen.add(child.pid!);
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  return { child, out: () => out };
}

/** Runs a CLI command as `role` to its end (bounded). */
async function cli(role: Role, args: string[]): Promise<{ code: number | null; out: string }> {
  const { child, out } = start(role, args);
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  const code = await new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)));
  clearTimeout(timer);
  return { code, out: out() };
}

async function as(role: Role): Promise<NatsConnection> {
  // Its role's reply subjects, as every gym-ckpt process of that role takes them.
  const nc = await connect({ servers: server.url, user: role, pass: PASSWORDS[role], inboxPrefix: NATS_INBOX_PREFIXES[role] });
  connections.push(nc);
  return nc;
}

/** A put straight to a bucket's KV subject, as nats.js's kv.put sends it: the answer or the error. */
async function put(nc: NatsConnection, bucket: string, key: string): Promise<string> {
  try {
    await nc.request(`$KV.${bucket}.${key}`, "forged", { timeout: 3_000 });
    return "accepted";
  } catch (error) {
    return String(error);
  }
}

async function lastSeq(nc: NatsConnection, bucket: string): Promise<number> {
  const reply = await nc.request(`$JS.API.STREAM.INFO.KV_${bucket}`, "", { timeout: 3_000 });
  return (reply.json() as { state: { last_seq: number } }).state.last_seq;
}

/** A bucket's stream state (its message count and first sequence), or the API's error when it is gone. */
async function streamState(nc: NatsConnection, bucket: string): Promise<unknown> {
  const reply = (await nc.request(`$JS.API.STREAM.INFO.KV_${bucket}`, "", { timeout: 3_000 })).json<{ state?: { messages: number; first_seq: number }; error?: unknown }>();
  return reply.state ?? reply.error;
}

async function latest(nc: NatsConnection, bucket: string, key: string): Promise<string> {
  const reply = await nc.request(`$JS.API.STREAM.MSG.GET.KV_${bucket}`, JSON.stringify({ last_by_subj: `$KV.${bucket}.${key}` }), { timeout: 3_000 });
  // A purge marker carries no data.
  return Buffer.from((reply.json() as { message: { data?: string } }).message.data ?? "", "base64").toString();
}

beforeAll(async () => {
  ensureBuilt();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-natsperms-"));
  const config = join(dir, "nats.conf");
  await writeFile(config, singleNodeConfig(await readFile(CONF, "utf8")));
  // The server inherits this process's environment: the file reads its passwords from it.
  Object.assign(process.env, { SERVER_NAME: "perm-test", COORDINATOR_PASSWORD: PASSWORDS.coordinator, GYM_PASSWORD: PASSWORDS.gym, CONTROLLER_PASSWORD: PASSWORDS.controller });
  server = await NatsServerProcess.start({ args: ["-c", config] });
}, 30_000);

afterAll(async () => {
  for (const child of spawned) for (const p of descendants(child.pid!)) seen.add(p.pid);
  killAll(seen);
  await Promise.allSettled(connections.map((nc) => nc.close()));
  await server?.dispose();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe("the production NATS permissions, per role", () => {
  it("let the coordinator, the Gym and the CLI work, refuse the gym and controller users the leader lease and the journal, and the gym user the other roles' replies", async () => {
    const coordinator = start("coordinator", ["coordinator", "--deployment", DEPLOYMENT, "--token", TOKEN, "--controller-token", CONTROLLER_TOKEN, "--checkpoint-root", join(dir, "root"), "--no-http", "--lease-ms", "2000", "--log-level", "warn"]);
    const gym = start("gym", ["gym", "--deployment", DEPLOYMENT, "--token", TOKEN, "--checkpoint-root", join(dir, "root")]);
    coordinatorRun = coordinator;
    gymRun = gym;
    await waitUntil(() => gym.out().split("\n").some((line) => line.includes('"name":"gym"') && line.includes('"ready":true')) || gym.child.exitCode !== null, "the gym's ready line", 60_000).catch((error: Error) => {
      throw new Error(`${error.message}\n${gym.out()}\n${coordinator.out()}`);
    });
    expect(gym.child.exitCode, gym.out()).toBeNull();

    // A Gym server's credentials listening for other roles' replies (status replies, controller API
    // replies), under any inbox prefix: every subscription refused, nothing overheard meanwhile.
    const spy = await as("gym");
    const overheard: string[] = [];
    const refused = new Map<string, string>();
    for (const subject of ["_INBOX.>", `${NATS_INBOX_PREFIXES.coordinator}.>`, `${NATS_INBOX_PREFIXES.controller}.>`]) {
      spy.subscribe(subject, {
        callback: (error, msg) => {
          if (error) refused.set(subject, String(error));
          else overheard.push(msg.subject);
        },
      });
    }

    // Every reference participant announced (members bucket) and answers the coordinator's status.
    let status = { code: null as number | null, out: "" };
    await waitUntil(async () => {
      status = await cli("controller", ["status", "--deployment", DEPLOYMENT, "--token", CONTROLLER_TOKEN]);
      return status.code === 0 && ["agent", "environment", "model", "resources"].every((kind) => new RegExp(`^${kind}\\s.*idle`, "m").test(status.out));
    }, `status to list the four participants idle (last: ${status.out})`, 30_000);
    expect(status.out).toMatch(/leader epoch \d+/);
    await waitUntil(() => refused.size === 3, "the gym user's subscriptions to the coordinator's and controllers' replies to be refused").catch((error: Error) => {
      throw new Error(`${error.message}; refused: ${JSON.stringify([...refused])}; overheard: ${JSON.stringify(overheard.slice(0, 5))}`);
    });
    for (const reason of refused.values()) expect(reason).toMatch(/permissions violation for subscription/i);
    expect(overheard).toEqual([]);

    const checkpoint = await cli("controller", ["checkpoint", "--deployment", DEPLOYMENT, "--token", CONTROLLER_TOKEN, "--episodes", "none"]);
    expect(checkpoint.out).toMatch(/^published \S+ \(epoch \d+, 4 participants\)/m);
    expect(checkpoint.code).toBe(0);
    // The coordinator removes the closed checkpoint's journal entry after it answers (an empty purge
    // marker takes its place): waited for, so the journal holds still for this file's reads of it.
    const reader = await as("coordinator");
    const id = /^published (\S+)/m.exec(checkpoint.out)![1]!;
    await waitUntil(async () => (await latest(reader, journalBucket(DEPLOYMENT), id)) === "", "the checkpoint's journal entry removed");

    // Nothing but the spy was refused so far: every process's requests, replies (allow_responses)
    // and KV watches stayed within its role's permissions, not just the ones the CLI's output shows.
    const violations = server.log.split("\n").filter((line) => line.includes("Violation"));
    expect(violations.map((line) => /Subscription Violation - User "gym", Subject "([^"]+)"/.exec(line)?.[1] ?? line).sort()).toEqual([...refused.keys()].sort());

    // Forged writes into the fencing state: refused by the server, nothing written.
    const journalBefore = await lastSeq(reader, journalBucket(DEPLOYMENT));
    for (const role of ["gym", "controller"] as const) {
      const nc = await as(role);
      expect(await put(nc, leaderBucket(DEPLOYMENT), "coordinator"), role).toMatch(/permissions violation/i);
      expect(await put(nc, journalBucket(DEPLOYMENT), "ckpt-forged"), role).toMatch(/permissions violation/i);
    }
    await waitUntil(() => server.log.includes(`Publish Violation - User "gym", Subject "$KV.${leaderBucket(DEPLOYMENT)}.coordinator"`), "the server to log the gym user's refused lease write");
    expect(await lastSeq(reader, journalBucket(DEPLOYMENT))).toBe(journalBefore);
    // The lease renews meanwhile, so its bucket moves on: its latest value is still the coordinator's.
    expect(await latest(reader, leaderBucket(DEPLOYMENT), "coordinator")).not.toBe("forged");
    expect(coordinator.child.exitCode, coordinator.out()).toBeNull();
    expect(gym.child.exitCode, gym.out()).toBeNull();
  }, 120_000);

  it("give the gym user no publish outside its permissions by replying to its own status request", async () => {
    const coordinator = coordinatorRun!;
    const gym = gymRun!;
    expect(coordinator.child.exitCode, coordinator.out()).toBeNull();
    const reader = await as("coordinator");
    const journalBefore = await streamState(reader, journalBucket(DEPLOYMENT));
    // The first test's checkpoint left its entry's removal marker in the journal: a purge would show.
    expect((journalBefore as { messages: number }).messages).toBeGreaterThan(0);

    // A Gym server's credentials may publish a participant's status subject and subscribe to it:
    // publishing it with a reply subject of its own choice, it receives its own request. The
    // server must not take that reply subject for one it may now answer (allow_responses).
    const attacker = await as("gym");
    const selfGranted = async (target: string): Promise<string> => {
      const own = participantSubject(DEPLOYMENT, "agent", "spoof", "status");
      const received = new Promise<string | undefined>((resolve) => attacker.subscribe(own, { max: 1, callback: (_error, msg) => resolve(msg?.reply) }));
      await attacker.flush();
      attacker.publish(own, "", { reply: target });
      expect(await received).toBe(target);
      try {
        await attacker.request(target, "forged", { timeout: 3_000 });
        return "accepted";
      } catch (error) {
        return String(error);
      }
    };
    for (const target of [
      `$KV.${leaderBucket(DEPLOYMENT)}.coordinator`, // the lease: its revisions are the epochs
      `$KV.${journalBucket(DEPLOYMENT)}.ckpt-forged`, // a decision
      `$JS.API.STREAM.DELETE.KV_${journalBucket(DEPLOYMENT)}`, // every decision
      participantSubject(DEPLOYMENT, "agent", "victim", "commit"), // a phase message, as the coordinator
      controllerSubject(DEPLOYMENT, "restore"), // a controller op
    ]) {
      expect(await selfGranted(target), target).toMatch(/permissions violation/i);
    }
    expect(await streamState(reader, journalBucket(DEPLOYMENT))).toEqual(journalBefore);
    expect(await latest(reader, leaderBucket(DEPLOYMENT), "coordinator")).not.toBe("forged");
    expect(coordinator.child.exitCode, coordinator.out()).toBeNull();
    expect(gym.child.exitCode, gym.out()).toBeNull();
  }, 60_000);

  it("let no controller publish with the coordinator's permissions through the reply subject of its request", async () => {
    const coordinator = coordinatorRun!;
    const gym = gymRun!;
    expect(coordinator.child.exitCode, coordinator.out()).toBeNull();
    const reader = await as("coordinator");
    const journalBefore = await streamState(reader, journalBucket(DEPLOYMENT));
    expect((journalBefore as { messages: number }).messages).toBeGreaterThan(0);

    // A controller's request names the subject the coordinator answers on; the coordinator's
    // answer is published with the coordinator's permissions (the lease, the journal, its purges,
    // every participant op). An answer may only go to a reply inbox.
    const controller = await as("controller");
    for (const target of [`$JS.API.STREAM.PURGE.KV_${journalBucket(DEPLOYMENT)}`, `$KV.${journalBucket(DEPLOYMENT)}.ckpt-deputy`]) {
      controller.publish(controllerSubject(DEPLOYMENT, "status"), "{}", { reply: target });
    }
    // Delivered to the coordinator before the CLI's request, and it answers a subject's requests
    // (refusals at once) in order: once the CLI has its answer, those were answered, if at all.
    await controller.flush();
    const status = await cli("controller", ["status", "--deployment", DEPLOYMENT, "--token", CONTROLLER_TOKEN]);
    expect(status.code, status.out).toBe(0);
    // A purge the coordinator sent before its answer to the CLI ran before this read.
    expect(await streamState(reader, journalBucket(DEPLOYMENT))).toEqual(journalBefore);
    expect(coordinator.out()).toMatch(/"code":"invalid_request"[^\n]*reply subject/);
    expect(coordinator.child.exitCode, coordinator.out()).toBeNull();
    expect(gym.child.exitCode, gym.out()).toBeNull();
  }, 60_000);
});
