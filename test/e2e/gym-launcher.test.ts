import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import type { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { alive, descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/** `gym-ckpt gym` over the built CLI: the whole reference set starts, serves a rollout, and stops cleanly. */
let nats: NatsFixture;
let child: ChildProcess | undefined;
/** Every process a test saw, SIGKILLed in teardown whatever happened. */
const seen = new TrackedProcesses();

beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  if (child && child.exitCode === null) child.kill("SIGKILL");
  killAll(seen);
  await nats?.close();
});

function spawnGym(deployment: string, extra: string[] = []): ChildProcess {
  const gym = spawn(process.execPath, ["dist/coordinator/cli/main.js", "gym", "--nats", nats.server.url, "--deployment", deployment, "--token", "t0ken", ...extra], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  seen.add(gym.pid!);
  return gym;
}

/** Records every descendant of `root` in `seen` and returns their pids. */
function tree(root: number): { pid: number; cmdline: string }[] {
  const found = descendants(root);
  for (const p of found) seen.add(p.pid);
  return found;
}

function exitOf(child: ChildProcess): Promise<number | null> {
  return new Promise((resolve) => child.once("exit", (code) => resolve(code)));
}

/** Resolves at the first line of `stream` that `match` accepts; rejects if the process exits first. */
function lineFrom(stream: Readable, exited: Promise<number | null>, match: (line: string) => boolean): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    createInterface({ input: stream }).on("line", (line) => {
      if (match(line)) resolve();
    });
    void exited.then((code) => reject(new Error(`gym exited early (${code})`)));
  });
}

describe("gym-ckpt gym", () => {
  it("stops the children already started when SIGTERM comes during start-up", async () => {
    const gym = spawnGym("launcher-early", ["--verbose"]);
    const exited = exitOf(gym);
    // --verbose relays each child's lines: the policy's ready line means it is up and the next one starting.
    await lineFrom(gym.stderr!, exited, (line) => line.startsWith("[policy] ") && line.includes('"ready":true'));
    const started = tree(gym.pid!);
    expect(started.filter((p) => p.cmdline.includes("policy-backend/main.js"))).toHaveLength(1);
    gym.kill("SIGTERM");
    const code = await exited;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every child of the gym to exit");
    expect(code).toBe(0);
  });

  it("exits 1 and stops the rest when a child dies", async () => {
    const gym = spawnGym("launcher-crash");
    const exited = exitOf(gym);
    await lineFrom(gym.stdout!, exited, (line) => line.includes('"name":"gym"') && line.includes('"ready":true'));
    const children = tree(gym.pid!);
    const resources = children.find((p) => p.cmdline.includes("resources-server/main.js"));
    expect(resources).toBeDefined();
    // The launcher hands the control token to its servers through their environment, not argv
    // (/proc/<pid>/cmdline is world-readable); only the command line the user typed carries it.
    const servers = children.filter((p) => !p.cmdline.includes("gym/main.js"));
    expect(servers.length).toBeGreaterThanOrEqual(5);
    for (const p of servers) expect(p.cmdline).not.toContain("t0ken");
    process.kill(resources!.pid, "SIGKILL");
    expect(await exited).toBe(1);
    await waitUntil(() => children.every((p) => !alive(p.pid)), "every child of the gym to exit");
  });

  it("starts every reference server, runs an episode, and stops them all on SIGTERM", async () => {
    child = spawnGym("launcher");
    const ready = await new Promise<any>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no ready line")), 30_000);
      createInterface({ input: child!.stdout! }).on("line", (line) => {
        if (!line.startsWith("{")) return;
        const parsed = JSON.parse(line);
        if (parsed.ready && parsed.name === "gym") {
          clearTimeout(timer);
          resolve(parsed);
        }
      });
      child!.once("exit", (code) => reject(new Error(`gym exited early (${code})`)));
    });
    tree(child.pid!); // its servers are killed in teardown even if this test fails
    expect(Object.keys(ready.urls).sort()).toEqual(["agent", "environment", "model", "policy", "resources"]);
    for (const url of Object.values(ready.urls) as string[]) expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const response = await fetch(`${ready.urls.environment}/run`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rollout_id: "demo-1", attempt: 0, task: { expression: "6 * 7", tool_rounds: 1 } }),
    });
    expect(await response.json()).toEqual({ rollout_id: "demo-1", attempt: 0, reward: 1, answer: "42", continued_from: null });
    const ports = Object.values(ready.urls) as string[];
    const exited = exitOf(child!);
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    // Every child is gone: nothing answers on any of the URLs any more.
    for (const url of ports) await expect(fetch(`${url}/health`)).rejects.toThrow();
    expect(alive(child.pid!)).toBe(false);
  });

  it("refuses to start without a control token", async () => {
    const bare = spawn(process.execPath, ["dist/coordinator/cli/main.js", "gym", "--nats", nats.server.url], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, GYM_CKPT_TOKEN: "" } });
    seen.add(bare.pid!); // one that starts after all is stopped in teardown (its servers stop with it)
    let stderr = "";
    bare.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    const code = await exitOf(bare);
    expect(code).toBe(2);
    expect(stderr).toContain("control token is required");
  });

  it.each([
    { why: "cannot be reached", nats: "nats://nobody:s3cret@127.0.0.1:1", exit: 1, line: /^[\w-]+: unreachable: cannot reach NATS at nats:\/\/\[Redacted\]@127\.0\.0\.1:1 \(.*\): this participant cannot start until NATS is reachable/m },
    { why: "is a URL nats.js cannot parse (configuration)", nats: "nats://nobody:s3cret@127.0.0.1:99999", exit: 2, line: /^[\w-]+: invalid_request: cannot connect to NATS at nats:\/\/\[Redacted\]@127\.0\.0\.1:99999: /m },
  ])("a server whose NATS $why exits $exit with one readable line carrying its code (credentials redacted), not a stack trace", async ({ nats: url, exit, line }) => {
    // Tried once (the start's wait for a NATS server that is restarting is test/e2e/start-before-nats.test.ts's).
    const proc = spawn(process.execPath, ["dist/participants/attach/main.js", "--token", "t0ken", "--upstream", "http://127.0.0.1:9/v1", "--nats", url, "--nats-connect-wait-ms", "0"], { stdio: ["ignore", "pipe", "pipe"] });
    seen.add(proc.pid!);
    let stderr = "";
    proc.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    expect(await exitOf(proc)).toBe(exit);
    expect(stderr).toMatch(line);
    expect(stderr).not.toContain("s3cret");
    expect(stderr).not.toMatch(/^\s+at /m);
  });

  it("a second live process for one kind/instance exits 1 with instance_conflict in one line; the first serves on", async () => {
    const args = ["dist/participants/attach/main.js", "--token", "t0ken", "--upstream", "http://127.0.0.1:9/v1", "--nats", nats.server.url, "--deployment", `dup${process.pid}`, "--instance", "twin"];
    const first = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
    seen.add(first.pid!);
    const firstExited = exitOf(first);
    await lineFrom(first.stdout!, firstExited, (line) => line.includes('"ready":true'));
    const second = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
    seen.add(second.pid!);
    let stderr = "";
    let stdout = "";
    second.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    second.stdout!.on("data", (chunk) => (stdout += String(chunk)));
    expect(await exitOf(second)).toBe(1);
    expect(stderr).toContain("instance_conflict");
    expect(stderr).not.toMatch(/^\s+at /m);
    // It went through the stop steps (the proxy stopped admitting and drained), as on a signal.
    const logged = stdout.split("\n").filter((line) => line.startsWith("{")).map((line) => JSON.parse(line) as { msg?: string; code?: string });
    expect(logged).toContainEqual(expect.objectContaining({ msg: "shutting down", code: "instance_conflict" }));
    expect(first.exitCode).toBeNull();
    first.kill("SIGTERM");
    expect(await firstExited).toBe(0);
  });

  /** Runs a program until it exits; one that accepts its flags serves on, and is stopped (SIGTERM stops a gym's children too) so the test fails without leaving it behind. */
  const runToExit = async (entry: string, args: string[], env: Record<string, string> = {}) => {
    const proc = spawn(process.execPath, [entry, ...args, "--nats", nats.server.url], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, GYM_CKPT_TOKEN: "", ...env } });
    seen.add(proc.pid!);
    let stderr = "";
    proc.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    const stop = setTimeout(() => proc.kill("SIGTERM"), 10_000);
    const code = await exitOf(proc);
    clearTimeout(stop);
    return { code, stderr };
  };

  it("refuses tokens that could never authenticate (whitespace) before serving, in every process that takes one", async () => {
    const cases: [string, string[]][] = [
      ["dist/coordinator/cli/main.js", ["gym", "--token", "two words"]],
      ["dist/participants/gym/policy-backend/main.js", ["--token", "two words"]],
      ["dist/participants/gym/policy-backend/main.js", ["--token", "t0ken", "--cut-token", "cut token"]],
      ["dist/participants/attach/main.js", ["--token", "t0ken", "--upstream", "http://127.0.0.1:9/v1", "--cut-token", "cut token"]],
    ];
    for (const [entry, args] of cases) expect({ args, ...(await runToExit(entry, args)) }).toEqual({ args, code: 2, stderr: expect.stringContaining("a token must be visible ASCII") });
  });

  it("takes the cut token from GYM_CKPT_CUT_TOKEN too, checked like --cut-token: a command line is readable by every local user", async () => {
    const cases: [string, string[]][] = [
      ["dist/participants/gym/policy-backend/main.js", ["--token", "t0ken"]],
      ["dist/participants/attach/main.js", ["--token", "t0ken", "--upstream", "http://127.0.0.1:9/v1"]],
    ];
    for (const [entry, args] of cases) {
      expect({ entry, ...(await runToExit(entry, args, { GYM_CKPT_CUT_TOKEN: "cut token" })) }).toEqual({ entry, code: 2, stderr: expect.stringContaining("GYM_CKPT_CUT_TOKEN: a token must be visible ASCII") });
    }
  });

  it("refuses a relative --checkpoint-root before serving (checkpoint directories arrive absolute: every commit would be refused)", async () => {
    const cases: [string, string[]][] = [
      ["dist/participants/gym/resources-server/main.js", ["--token", "t0ken", "--checkpoint-root", "ckpt"]],
      ["dist/participants/attach/main.js", ["--token", "t0ken", "--upstream", "http://127.0.0.1:9/v1", "--checkpoint-root", "./ckpt"]],
    ];
    for (const [entry, args] of cases) expect({ args, ...(await runToExit(entry, args)) }).toEqual({ args, code: 2, stderr: expect.stringContaining("checkpointRoot: must be an absolute path") });
  });

  it("refuses resources-server flags it would ignore or that fail every commit: one line, exit 2", async () => {
    const cases: [string[], string][] = [
      // Written into every record, which refuses it: every commit with a live session failed internal_error.
      [["--owner", ""], "resources-server: owner (the routing id written into records) must be 1-200 characters\n"],
      [["--owner", "w".repeat(201)], "resources-server: owner (the routing id written into records) must be 1-200 characters\n"],
      // The counter's verify is declared wait: --verify replay was silently ignored.
      [["--server", "counter", "--verify", "replay"], "resources-server: the counter server's /verify is declared wait (it ends the counter it reads)\n"],
    ];
    for (const [args, stderr] of cases) {
      expect({ args, ...(await runToExit("dist/participants/gym/resources-server/main.js", ["--token", "t0ken", ...args])) }).toEqual({ args, code: 2, stderr });
    }
  });

  it("refuses an OTEL_EXPORTER_PROMETHEUS_PORT that is not a port as it refuses such a --metrics-port: one line, exit 2, no stack", async () => {
    for (const port of ["abc", "99999", "-1", "0x10"]) {
      const result = await runToExit("dist/participants/gym/resources-server/main.js", ["--token", "t0ken"], { OTEL_EXPORTER_PROMETHEUS_PORT: port });
      expect({ port, ...result }).toEqual({
        port,
        code: 2,
        stderr: `resources-server: invalid configuration: OTEL_EXPORTER_PROMETHEUS_PORT must be an integer from 0 to 65535 (0 = any free port), got ${JSON.stringify(port)}\n`,
      });
    }
  });
});
