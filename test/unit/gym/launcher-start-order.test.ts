import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { GYM_PROCESSES, launchGym, type Gym, type GymLaunchOptions, type GymProcessName } from "../../../participants/gym/gym-launcher.js";
import { alive } from "../../support/process-tree.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * launchGym over stand-in servers (no NATS): each prints the line it started with, then listens on
 * its --port and prints its ready line, unless a `hold-<name>` file in its control directory holds
 * it back or a `fail-<name>` file makes it exit 1.
 */
const FAKE_SERVER = `
const fs = require("node:fs");
const net = require("node:net");
const arg = (flag) => process.argv[process.argv.indexOf(flag) + 1];
const name = arg("--instance");
const control = process.env.FAKE_GYM_CONTROL;
const say = (fd, value) => fs.writeSync(fd, (typeof value === "string" ? value : JSON.stringify(value)) + "\\n");
say(2, { started: name, pid: process.pid, argv: process.argv.slice(2), nats: process.env.GYM_CKPT_NATS_URL });
process.stdin.on("end", () => process.exit(0)).resume();
// A linger-<name> file makes it take 500 ms to exit on SIGTERM (a server draining its calls).
process.on("SIGTERM", () => setTimeout(() => process.exit(0), fs.existsSync(control + "/linger-" + name) ? 500 : 0));
const go = () => {
  if (fs.existsSync(control + "/fail-" + name)) {
    say(2, name + " fails on purpose");
    process.exit(1);
  }
  if (fs.existsSync(control + "/hold-" + name)) return void setTimeout(go, 20);
  const server = net.createServer();
  server.on("error", (error) => {
    say(2, String(error));
    process.exit(1);
  });
  server.listen(Number(arg("--port")), "127.0.0.1", () => say(1, { ready: true, url: "http://127.0.0.1:" + server.address().port }));
};
go();
`;
const ENTRIES = ["gym/policy-backend/main.js", "attach/main.js", "gym/resources-server/main.js", "gym/agent-server/main.js", "gym/environment-server/main.js"];

let dir: string;
let gym: Gym | undefined;
let pending: Promise<unknown> | undefined;
let blockers: Server[] = [];
/** In the order they came: each start (with its pid and flags), ready line and other output line. */
let events: { name: GymProcessName; started?: { pid: number; argv: string[]; nats?: string }; ready?: string; line: string }[];
let unhandled: unknown[];
const onUnhandled = (reason: unknown) => unhandled.push(reason);

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "launcher-order-"));
  for (const entry of ENTRIES) {
    mkdirSync(dirname(join(dir, "tree", entry)), { recursive: true });
    writeFileSync(join(dir, "tree", entry), FAKE_SERVER);
  }
  mkdirSync(join(dir, "control"));
  events = [];
  unhandled = [];
  process.on("unhandledRejection", onUnhandled);
});
afterEach(async () => {
  rmSync(join(dir, "control"), { recursive: true, force: true }); // releases anything held
  await pending?.catch(() => undefined);
  await gym?.stop();
  gym = undefined;
  pending = undefined;
  for (const b of blockers) await new Promise((resolve) => b.close(resolve));
  blockers = [];
  process.off("unhandledRejection", onUnhandled);
  rmSync(dir, { recursive: true, force: true });
});

const hold = (name: GymProcessName) => writeFileSync(join(dir, "control", `hold-${name}`), "");
const release = (name: GymProcessName) => rmSync(join(dir, "control", `hold-${name}`));
const fail = (name: GymProcessName) => writeFileSync(join(dir, "control", `fail-${name}`), "");
const linger = (name: GymProcessName) => writeFileSync(join(dir, "control", `linger-${name}`), "");
const instances = Object.fromEntries(GYM_PROCESSES.map((name) => [name, name]));

function launch(extra: Partial<GymLaunchOptions> = {}): Promise<Gym> {
  const launching = launchGym({
    nats: "nats://127.0.0.1:1",
    deployment: "order",
    token: "t0ken",
    participantsDir: join(dir, "tree"),
    instances,
    env: { FAKE_GYM_CONTROL: join(dir, "control") },
    readyTimeoutMs: 10_000,
    onOutput: (name, line) => {
      const parsed = line.startsWith("{") ? (JSON.parse(line) as { started?: string; pid?: number; argv?: string[]; nats?: string; ready?: boolean; url?: string }) : {};
      if (parsed.started) events.push({ name, started: { pid: parsed.pid!, argv: parsed.argv!, ...(parsed.nats !== undefined && { nats: parsed.nats }) }, line });
      else if (parsed.ready) events.push({ name, ready: parsed.url!, line });
      else events.push({ name, line });
    },
    ...extra,
  });
  pending = launching;
  return launching;
}
const isReady = (name: GymProcessName) => events.some((e) => e.name === name && e.ready);
const wasStarted = (name: GymProcessName) => events.some((e) => e.name === name && e.started);
/** The flags of `name`'s last start. */
const argvOf = (name: GymProcessName) => events.filter((e) => e.name === name && e.started).at(-1)!.started!.argv;
const flag = (argv: string[], name: string) => argv[argv.indexOf(name) + 1];

/** Every running process was started with the current URL of each process it calls. */
function expectCurrentUrls(g: Gym): void {
  const urls = g.urls;
  expect(flag(argvOf("model"), "--upstream")).toBe(urls.policy);
  expect([flag(argvOf("agent"), "--policy-url"), flag(argvOf("agent"), "--resources-url")]).toEqual([urls.model, urls.resources]);
  expect([flag(argvOf("environment"), "--agent-url"), flag(argvOf("environment"), "--resources-url")]).toEqual([urls.agent, urls.resources]);
  for (const p of g.processes.values()) expect(p.pid).toBe(events.filter((e) => e.name === p.name && e.started).at(-1)!.started!.pid);
}

describe("gym launcher: each process starts once the ones it calls are ready", () => {
  it("starts resources beside the policy: resources is ready while the policy still is not", async () => {
    hold("policy");
    const launching = launch();
    // Before: one after another, resources waited for the policy and the model.
    await waitUntil(() => isReady("resources"), "resources to be ready while the policy is held", 5_000);
    expect({ policy: isReady("policy"), model: wasStarted("model") }).toEqual({ policy: false, model: false });
    release("policy");
    gym = await launching;
    expect([...gym.processes.keys()].sort()).toEqual([...GYM_PROCESSES].sort());
    // Each one after what it calls is ready.
    const at = (name: GymProcessName, what: "started" | "ready") => events.findIndex((e) => e.name === name && e[what] !== undefined);
    expect(at("model", "started")).toBeGreaterThan(at("policy", "ready"));
    expect(at("agent", "started")).toBeGreaterThan(Math.max(at("model", "ready"), at("resources", "ready")));
    expect(at("environment", "started")).toBeGreaterThan(at("agent", "ready"));
    expectCurrentUrls(gym);
  });

  it("a start failing beside another: that one's outcome is awaited, nothing more starts, everything is stopped, no unhandled rejection", async () => {
    hold("policy");
    fail("resources");
    let settled = false;
    const outcome = launch().then(
      () => "launched",
      (error: unknown) => (error instanceof Error ? error.message : String(error)),
    );
    void outcome.finally(() => (settled = true));
    await waitUntil(() => events.some((e) => e.name === "resources" && e.line.includes("fails on purpose")), "resources to fail while the policy is held", 5_000);
    // A window, not an event: what is checked is that nothing happens (no rejection) while the
    // policy is held, and a launcher that threw early would do so within a few ms of the failure.
    await new Promise((resolve) => setTimeout(resolve, 200));
    // Not thrown while the policy still starts: a stop then would leave its start's outcome to nobody.
    expect(settled).toBe(false);
    release("policy");
    expect(await outcome).toContain("resources exited (code 1");
    await new Promise((resolve) => setImmediate(resolve));
    const pids = events.flatMap((e) => (e.started ? [e.started.pid] : []));
    expect({ started: events.filter((e) => e.started).map((e) => e.name), alive: pids.filter(alive), unhandled }).toEqual({
      started: expect.arrayContaining(["policy", "resources"]),
      alive: [],
      unhandled: [],
    });
    expect(wasStarted("model")).toBe(false);
  });

  it("an abort while two start side by side ends both: nothing left running, no unhandled rejection", async () => {
    hold("policy");
    hold("resources");
    const abort = new AbortController();
    const outcome = launch({ signal: abort.signal }).then(
      () => "launched",
      (error: unknown) => (error instanceof Error ? error.message : String(error)),
    );
    await waitUntil(() => wasStarted("policy") && wasStarted("resources"), "policy and resources to start side by side", 5_000);
    abort.abort(new Error("enough"));
    expect(await outcome).toContain("aborted: enough");
    await new Promise((resolve) => setImmediate(resolve));
    const pids = events.flatMap((e) => (e.started ? [e.started.pid] : []));
    expect({ alive: pids.filter(alive), unhandled, model: wasStarted("model") }).toEqual({ alive: [], unhandled: [], model: false });
  });

  it("two moved processes restarted side by side restart their shared callers with the URLs both moved to", async () => {
    gym = await launch();
    const taken = { model: Number(new URL(gym.urls.model!).port), resources: Number(new URL(gym.urls.resources!).port) };
    await gym.kill(["model", "resources"]);
    for (const port of Object.values(taken)) {
      const b = createServer();
      blockers.push(b);
      await new Promise<void>((resolve, reject) => b.once("error", reject).listen(port, "127.0.0.1", () => resolve()));
    }
    await gym.start(["model", "resources"]);
    expect(Number(new URL(gym.urls.model!).port)).not.toBe(taken.model);
    expect(Number(new URL(gym.urls.resources!).port)).not.toBe(taken.resources);
    expect([...gym.processes.keys()].sort()).toEqual([...GYM_PROCESSES].sort());
    expectCurrentUrls(gym);
    const running = [...gym.processes.values()].map((p) => p.pid);
    const pids = events.flatMap((e) => (e.started ? [e.started.pid] : []));
    expect(pids.filter(alive).sort()).toEqual(running.sort());
  });
});

describe("gym launcher: a start() while another is under way", () => {
  it("waits for it, then starts only what still is not running: one process per name, none left running after stop", async () => {
    gym = await launch({ initial: ["policy"] });
    hold("model");
    const first = gym.start(["model"]);
    const second = gym.start(["model"]);
    await waitUntil(() => wasStarted("model"), "the first start of the model", 5_000);
    // A window for a non-event (no second model while the first is held); the count after both
    // starts return below covers a second model started later.
    await new Promise((resolve) => setTimeout(resolve, 200));
    // Before: the second call started a model of its own beside the held one.
    expect(events.filter((e) => e.name === "model" && e.started)).toHaveLength(1);
    release("model");
    await Promise.all([first, second]);
    const pids = events.flatMap((e) => (e.started ? [e.started.pid] : []));
    expect(pids.filter(alive).sort()).toEqual([...gym.processes.values()].map((p) => p.pid).sort());
    expect(events.filter((e) => e.name === "model" && e.started)).toHaveLength(1);
    await gym.stop();
    expect(pids.filter(alive)).toEqual([]);
  });

  it("one waiting behind another when stop() comes starts nothing and rejects", async () => {
    gym = await launch({ initial: ["policy"] });
    hold("model");
    const first = gym.start(["model"]).catch((error: unknown) => error);
    const second = gym.start(["resources"]).catch((error: unknown) => error);
    await waitUntil(() => wasStarted("model"), "the first start of the model", 5_000);
    await gym.stop();
    expect(await first).toBeInstanceOf(Error); // its model was killed while starting
    expect(String(await second)).toContain("gym stopped before this start began (resources)");
    expect(wasStarted("resources")).toBe(false);
    const pids = events.flatMap((e) => (e.started ? [e.started.pid] : []));
    expect(pids.filter(alive)).toEqual([]);
  });
});

describe("gym launcher: a start() overtaken by stop() whose names need no process", () => {
  it("rejects as any start overtaken by a stop does, rather than resolving after the stop", async () => {
    gym = await launch({ initial: ["model"], external: { policy: "http://127.0.0.1:9" } });
    hold("resources");
    const first = gym.start(["resources"]).catch((error: unknown) => error);
    const second = gym.start(["policy"]).then(
      () => "resolved",
      (error: unknown) => String(error),
    );
    await waitUntil(() => wasStarted("resources"), "the first start of resources", 5_000);
    await gym.stop();
    expect(await first).toBeInstanceOf(Error);
    // Before: the external policy needs no start, so the call resolved although stop() came first.
    expect(await second).toContain("gym stopped before this start began");
  });
});

describe("gym launcher: a start() while a stop() is under way", () => {
  it("waits for the stop, then starts its names: neither skipped as running nor started unknown to the map", async () => {
    gym = await launch({ initial: ["policy"] });
    linger("policy"); // the stop takes 500 ms, longer than a start
    const stopping = gym.stop();
    await gym.start(["policy", "resources"]);
    await stopping;
    // Before: the policy, still in the map while it was being stopped, was not started again, and
    // resources started at once, was cleared from the map by the stop and ran on, unknown to it.
    const pids = events.flatMap((e) => (e.started ? [e.started.pid] : []));
    expect({ running: [...gym.processes.keys()].sort(), alive: pids.filter(alive).sort() }).toEqual({
      running: ["policy", "resources"],
      alive: [...gym.processes.values()].map((p) => p.pid).sort(),
    });
    await gym.stop();
    expect(pids.filter(alive)).toEqual([]);
  });
});

describe("gym launcher: a start() that fails while two moved processes restart their callers", () => {
  it("restarts nothing more after the failure and stops every process it started before it rejects", async () => {
    gym = await launch();
    const before = Object.fromEntries([...gym.processes.values()].map((p) => [p.name, p.pid]));
    const taken = [Number(new URL(gym.urls.model!).port), Number(new URL(gym.urls.resources!).port)];
    await gym.kill(["model", "resources"]);
    for (const port of taken) {
      const b = createServer();
      blockers.push(b);
      await new Promise<void>((resolve, reject) => b.once("error", reject).listen(port, "127.0.0.1", () => resolve()));
    }
    // The model moves first and its caller, the agent, fails its restart; resources is held until then.
    hold("resources");
    fail("agent");
    const outcome = gym.start(["model", "resources"]).then(
      () => "started",
      (error: unknown) => (error instanceof Error ? error.message : String(error)),
    );
    await waitUntil(() => events.some((e) => e.name === "agent" && e.line.includes("fails on purpose")), "the agent's restart to fail", 10_000);
    release("resources");
    expect(await outcome).toContain("agent exited (code 1");
    await new Promise((resolve) => setImmediate(resolve));
    const pids = events.flatMap((e) => (e.started ? [e.started.pid] : []));
    // Before: resources moved after the failure and restarted the environment; the moved model,
    // resources and that environment were left running.
    expect({ environmentStarts: events.filter((e) => e.name === "environment" && e.started).length, alive: pids.filter(alive).sort() }).toEqual({
      environmentStarts: 1,
      alive: [before.policy, before.environment].sort(),
    });
    expect([...gym.processes.keys()].sort()).toEqual(["environment", "policy"]);
    expect(unhandled).toEqual([]);
  });
});

describe("gym launcher: the NATS servers reach each process in its environment, not its command line", () => {
  it("no credential of the NATS URL is on any child's command line (readable by every local user in /proc/<pid>/cmdline)", async () => {
    const servers = "nats://gym:Pa55w0rd@127.0.0.1:1/?token=T0kenQ";
    gym = await launch({ nats: servers, env: { FAKE_GYM_CONTROL: join(dir, "control"), GYM_CKPT_NATS_URL: "nats://inherited:4222" } });
    for (const name of GYM_PROCESSES) {
      const started = events.filter((e) => e.name === name && e.started).at(-1)!.started!;
      expect(started.argv.join(" ")).not.toMatch(/Pa55w0rd|T0kenQ/);
      expect(started.argv).not.toContain("--nats");
      // The launch's servers, over an inherited GYM_CKPT_NATS_URL.
      expect(started.nats).toBe(servers);
    }
  });
});
