import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { appendFile, mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { hostname } from "node:os";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { register } from "../../../coordinator/cli/commands/collect.js";
import { readResults } from "../../../coordinator/collect/results-file.js";

/** `gym-ckpt collect` in process: its flags are checked before anything is created or connected. */
let dir: string;
let server: Server | undefined;
let stderr: string;
let stdout: string;
const signals = ["SIGUSR1", "SIGTERM", "SIGINT", "SIGHUP"] as const;
let before: Map<string, Function[]>;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collect-cli-"));
  await writeFile(join(dir, "tasks.jsonl"), '{"id":"a","task":{}}\n');
  stderr = "";
  stdout = "";
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => ((stdout += String(chunk)), true));
  before = new Map(signals.map((s) => [s, process.listeners(s)]));
  process.exitCode = undefined;
});
afterEach(async () => {
  vi.restoreAllMocks();
  // The command installs its signal handlers: take them off this test process.
  for (const s of signals) for (const l of process.listeners(s)) if (!before.get(s)!.includes(l)) process.off(s, l as () => void);
  process.exitCode = undefined;
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

async function collect(...args: string[]): Promise<number> {
  const program = new Command().exitOverride();
  register(program);
  await program.parseAsync(["collect", "--tasks", join(dir, "tasks.jsonl"), "--out", join(dir, "results.jsonl"), "--checkpoint-dir", join(dir, "ckpt"), "--token", "t", ...args], { from: "user" });
  return Number(process.exitCode ?? 0);
}

/** One server for the controller's HTTP API (a fresh deployment, nothing open or published) and the /run route. */
async function serve(onRun: () => unknown = () => ({ reward: 1 })): Promise<string> {
  server = createServer((req, res) => {
    res.setHeader("content-type", "application/json");
    if (req.url === "/v1/status") {
      res.end(JSON.stringify({ deployment: "default", coordinator: { id: "c", leader: true, ready: true, epoch: 1 }, checkpoint: null, participants: [] }));
    } else if (req.url === "/v1/checkpoints") {
      res.end(JSON.stringify({ latest: null, checkpoints: [] }));
    } else if (req.url === "/v1/retire" || req.url === "/v1/forget") {
      req.resume();
      req.on("end", () => res.end(JSON.stringify({ participants: [] })));
    } else if (req.url === "/run") {
      req.resume();
      req.on("end", () => void Promise.resolve(onRun()).then((body) => res.end(JSON.stringify(body))));
    } else {
      res.statusCode = 404;
      res.end(JSON.stringify({ error: { code: "not_found", detail: req.url } }));
    }
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as { port: number }).port}`;
}

describe("gym-ckpt collect flags", () => {
  it.each([
    ["--concurrency", "0.5"],
    ["--max-attempts", "1.5"],
    ["--records-every-rows", "2.5"],
  ])("refuses a fractional %s (invalid_request, exit 2) before creating anything", async (flag, value) => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", flag, value)).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${flag} must be a positive integer`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each([
    ["--metrics-port", "-1", "an integer from 0 to 65535"],
    ["--metrics-port", "http", "an integer from 0 to 65535"],
    ["--leader-wait-ms", "1.5", "an integer ≥ 0"],
    ["--leader-wait-ms", "", "an integer ≥ 0"],
  ])("refuses %s %j (invalid_request, exit 2) before creating anything", async (flag, value, range) => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", flag, value)).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${flag} must be ${range}, got ${JSON.stringify(value)}`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each(["-run1", "run 1", "r/1", "x".repeat(200)])("refuses --rollout-id-prefix %j (invalid_request, exit 2) before creating anything", async (value) => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", "--rollout-id-prefix", value)).toBe(2);
    expect(stderr).toContain("error invalid_request: --rollout-id-prefix must match");
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each(["0", "1.5", "257", "lots"])("refuses --max-run-reply-mib %j: a whole number of MiB from 1 to 256 (invalid_request, exit 2) before creating anything", async (value) => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", "--max-run-reply-mib", value)).toBe(2);
    expect(stderr).toContain(`error invalid_request: --max-run-reply-mib must be an integer from 1 to 256, got ${JSON.stringify(value)}`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it("--max-run-reply-mib raises the /run reply cap: a reply past a smaller cap fails its attempt, one within it finishes", async () => {
    const base = await serve(() => ({ reward: 1, trajectory: { pad: "x".repeat(1536 * 1024) } })); // 1.5 MiB
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--max-attempts", "1", "--max-run-reply-mib", "1")).toBe(1);
    expect(await readResults(join(dir, "results.jsonl"))).toEqual(new Map());
    // The row failed for good: the same collection again (--new-collection) with room for the reply finishes it.
    process.exitCode = undefined;
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--new-collection", "--max-run-reply-mib", "2")).toBe(0);
    expect([...(await readResults(join(dir, "results.jsonl"))).keys()]).toEqual(["a"]);
  });

  it("checks its flags before the token: a bad flag without a token is still invalid_request, exit 2", async () => {
    const saved = { a: process.env.GYM_CKPT_CONTROLLER_TOKEN, b: process.env.GYM_CKPT_TOKEN };
    delete process.env.GYM_CKPT_CONTROLLER_TOKEN;
    delete process.env.GYM_CKPT_TOKEN;
    try {
      const program = new Command().exitOverride();
      register(program);
      const base = ["collect", "--tasks", join(dir, "tasks.jsonl"), "--out", join(dir, "results.jsonl"), "--checkpoint-dir", join(dir, "ckpt"), "--run-url", "http://127.0.0.1:2/run"];
      await program.parseAsync([...base, "--concurrency", "0"], { from: "user" });
      expect(Number(process.exitCode)).toBe(2);
      expect(stderr).toContain("error invalid_request: --concurrency");
      process.exitCode = undefined;
      stderr = "";
      const again = new Command().exitOverride();
      register(again);
      await again.parseAsync(base, { from: "user" });
      expect(Number(process.exitCode)).toBe(1);
      expect(stderr).toContain("error unauthorized");
      expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
    } finally {
      if (saved.a !== undefined) process.env.GYM_CKPT_CONTROLLER_TOKEN = saved.a;
      if (saved.b !== undefined) process.env.GYM_CKPT_TOKEN = saved.b;
    }
  });

  it("refuses --json, which collect cannot honour (invalid_request, exit 2)", async () => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", "--json")).toBe(2);
    expect(stderr).toContain("error invalid_request: --json");
  });

  it("refuses an --out that is the --tasks file (by its path or through a link): results appended there would become tasks of the next start", async () => {
    const tasks = join(dir, "tasks.jsonl");
    await symlink(tasks, join(dir, "link.jsonl"));
    for (const out of [tasks, join(dir, "link.jsonl")]) {
      stderr = "";
      process.exitCode = undefined;
      expect(await collect("--run-url", "http://127.0.0.1:2/run", "--http-url", "http://127.0.0.1:2", "--leader-wait-ms", "0", "--out", out)).toBe(2);
      expect(stderr).toContain("error invalid_request: --out");
    }
    expect((await readdir(dir)).sort()).toEqual(["link.jsonl", "tasks.jsonl"]);
  });

  it("refuses an --out that is the collector's own dispatched.jsonl or collector.pid (by its path or through a link): results appended there broke every later start", async () => {
    const ckpt = join(dir, "ckpt");
    await mkdir(ckpt);
    await writeFile(join(ckpt, "dispatched.jsonl"), "");
    await symlink(join(ckpt, "dispatched.jsonl"), join(dir, "log-link.jsonl"));
    for (const out of [join(ckpt, "dispatched.jsonl"), join(ckpt, "collector.pid"), join(dir, "log-link.jsonl")]) {
      stderr = "";
      process.exitCode = undefined;
      expect(await collect("--run-url", "http://127.0.0.1:2/run", "--http-url", "http://127.0.0.1:2", "--leader-wait-ms", "0", "--out", out)).toBe(2);
      expect(stderr).toContain("error invalid_request: --out");
      expect(stderr).toContain("is the collector's own");
    }
    expect(await readdir(ckpt)).toEqual(["dispatched.jsonl"]);
    // Beside them is fine: results.jsonl in the checkpoint directory is no file of the collector's.
    await rm(join(ckpt, "dispatched.jsonl"));
    process.exitCode = undefined;
    const base = await serve();
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--out", join(ckpt, "results.jsonl"))).toBe(0);
    expect([...(await readResults(join(ckpt, "results.jsonl"))).keys()]).toEqual(["a"]);
  });

  it("talks to the coordinator over HTTP when --http-url is given", async () => {
    const base = await serve();
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--nats-url", "nats://127.0.0.1:1")).toBe(0);
    expect([...(await readResults(join(dir, "results.jsonl"))).keys()]).toEqual(["a"]);
  });

  it.each([
    ["--checkpoint-every", "Infinity"],
    ["--checkpoint-every", "1e12"],
    ["--records-every-s", "1e12"],
    ["--checkpoint-timeout-s", "604801"],
    ["--run-timeout-s", "Infinity"],
    ["--progress-interval-s", "0"],
    ["--run-timeout-s", "soon"],
    ["--run-timeout-s", "0x10"],
    ["--checkpoint-timeout-s", "1e3"],
  ])("refuses %s %j: a duration must be positive and at most the 7-day cap (invalid_request, exit 2)", async (flag, value) => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", flag, value)).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${flag} must be a positive number of seconds up to 604800 (7 days), got ${JSON.stringify(value)}`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each([
    [["--log-level", "bogus"], "--log-level must be one of fatal, error, warn, info, debug, trace, silent"],
    [["--run-url", "not-a-url"], "--run-url must be an http or https URL"],
    [["--run-url", "file:///etc/passwd"], "--run-url must be an http or https URL"],
    [["--http-url", "127.0.0.1:8480"], "--http-url must be an http or https URL"],
    [["--tasks", "/nonexistent/tasks.jsonl"], "tasks file /nonexistent/tasks.jsonl does not exist"],
    [["--out", "/nonexistent/results.jsonl"], "--out: directory /nonexistent does not exist"],
    // Checked without --records-dir too: a typo must not pass until records are switched on.
    [["--records-kind", "training"], "--records-kind must be train or eval"],
    [["--records-env", "../gym"], "--records-env"],
  ])("refuses %j before creating anything (invalid_request, exit 2)", async (args, detail) => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", ...args)).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${detail}`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each([
    ["http://user:s3cret@127.0.0.1:8000/run", "--run-url may not carry credentials (user:password@)"],
    ["http://token@127.0.0.1:8000/run", "--run-url may not carry credentials (user:password@)"],
    ["http://127.0.0.1:6000/run", '--run-url names port 6000, which fetch blocks (a WHATWG "bad port"): use another port'],
    ["http://127.0.0.1:10080/run", '--run-url names port 10080, which fetch blocks (a WHATWG "bad port"): use another port'],
  ])("refuses --run-url %s, which fetch would refuse at every /run (invalid_request, exit 2, not echoed), before anything is created", async (runUrl, detail) => {
    expect(await collect("--run-url", runUrl, "--http-url", "http://127.0.0.1:2", "--leader-wait-ms", "0")).toBe(2);
    expect(stderr).toBe(`error invalid_request: ${detail}\n`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each([
    ["--run-url", "user:SECRET-abc123@127.0.0.1:8000/run"],
    ["--run-url", "ftp://user:SECRET-abc123@127.0.0.1:8000/run?code=SECRET-abc123"],
    ["--http-url", "user:SECRET-abc123@127.0.0.1:8480"],
  ])("refuses %s %j as not http(s) without echoing its credentials or query (invalid_request, exit 2)", async (flag, url) => {
    const args = flag === "--run-url" ? ["--run-url", url] : ["--run-url", "http://127.0.0.1:2/run", "--http-url", url];
    expect(await collect(...args, "--leader-wait-ms", "0")).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${flag} must be an http or https URL, got `);
    expect(stderr).toContain("127.0.0.1:");
    expect(stderr).not.toContain("SECRET-abc123");
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each([
    ["http://user:s3cret@127.0.0.1:8480", "--http-url may not carry credentials (user:password@)"],
    ["http://127.0.0.1:6000", '--http-url names port 6000, which fetch blocks (a WHATWG "bad port"): use another port'],
  ])("refuses --http-url %s with the other flags (invalid_request, exit 2, not echoed), not at its first call after the lock", async (httpUrl, detail) => {
    expect(await collect("--run-url", "http://127.0.0.1:2/run", "--http-url", httpUrl, "--leader-wait-ms", "0")).toBe(2);
    expect(stderr).toBe(`error invalid_request: ${detail}\n`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each([
    { what: "an empty path (not the working directory)", path: "", detail: () => "--checkpoint-dir must not be empty" },
    { what: "a regular file", path: "a-file", detail: () => `--checkpoint-dir ${join(dir, "a-file")} is not a directory` },
    { what: "a path under a regular file", path: "a-file/sub", detail: () => `--checkpoint-dir ${join(dir, "a-file", "sub")} cannot be created (ENOTDIR)` },
  ])("refuses --checkpoint-dir as $what (invalid_request, exit 2), not internal_error", async ({ path, detail }) => {
    await writeFile(join(dir, "a-file"), "x");
    expect(await collect("--run-url", "http://127.0.0.1:2/run", "--checkpoint-dir", path && join(dir, path))).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${detail()}`);
    expect((await readdir(dir)).sort()).toEqual(["a-file", "tasks.jsonl"]);
  });

  it.each([
    { what: "an empty path (not the working directory)", path: "", detail: () => "--records-dir must not be empty" },
    { what: "a regular file", path: "a-file", detail: () => `--records-dir ${join(dir, "a-file")} is not a directory` },
    { what: "a path under a regular file", path: "a-file/sub", detail: () => `--records-dir ${join(dir, "a-file", "sub")} is not accessible (ENOTDIR)` },
  ])("refuses --records-dir as $what (invalid_request, exit 2) before creating anything", async ({ path, detail }) => {
    await writeFile(join(dir, "a-file"), "x");
    expect(await collect("--run-url", "http://127.0.0.1:2/run", "--http-url", "http://127.0.0.1:2", "--leader-wait-ms", "0", "--records-dir", path && join(dir, path))).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${detail()}`);
    expect((await readdir(dir)).sort()).toEqual(["a-file", "tasks.jsonl"]);
  });

  it("refuses a --checkpoint-dir that mkdir answers ENOENT for under an existing parent (/proc) at once, where Node's recursive mkdir spins", { timeout: 10_000 }, async () => {
    const path = `/proc/gym-ckpt-${process.pid}/ckpt`;
    expect(await collect("--run-url", "http://127.0.0.1:2/run", "--checkpoint-dir", path)).toBe(2);
    expect(stderr).toContain(`error invalid_request: --checkpoint-dir ${path} cannot be created (ENOENT)`);
  });

  it("refuses an --out it cannot write (sysfs: not even root creates files there) up front: storage_error, exit 1, before any /run or lock", async () => {
    let runs = 0;
    const base = await serve(() => (runs++, { reward: 1 }));
    const out = `/sys/gym-ckpt-${process.pid}.jsonl`;
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--out", out)).toBe(1);
    expect(stderr).toMatch(new RegExp(`^error storage_error: --out ${out} cannot be written \\((EACCES|EROFS|EPERM)\\)\n$`));
    expect(runs).toBe(0);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
    expect(await readdir("/sys")).not.toContain(`.gym-ckpt-${process.pid}.jsonl.probe-${process.pid}`);
  });

  it.each([
    ["empty", ""],
    ["blank lines only", "\n  \n\n"],
  ])("refuses a --tasks with no rows (%s) before creating anything (invalid_request, exit 2), rather than 'finishing' with nothing done", async (_what, text) => {
    const base = await serve();
    await writeFile(join(dir, "tasks.jsonl"), text);
    expect(await collect("--run-url", `${base}/run`, "--http-url", base)).toBe(2);
    expect(stderr).toBe(`error invalid_request: --tasks ${join(dir, "tasks.jsonl")} has no rows\n`);
    expect(stdout).toBe("");
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it("a start-up refusal exits 1 and leaves no collector.pid behind", async () => {
    const base = await serve();
    await writeFile(join(dir, "results.jsonl"), "not json\n{}\n");
    expect(await collect("--run-url", `${base}/run`, "--http-url", base)).toBe(1);
    expect(stderr).toContain("error invalid_checkpoint_state: ");
    expect(existsSync(join(dir, "ckpt", "collector.pid"))).toBe(false);
  });
});

describe("gym-ckpt collect: one collector per checkpoint root", () => {
  it("refuses to start while the collector named in collector.pid runs (checkpoint_conflict, exit 1), touching nothing", async () => {
    const base = await serve();
    await mkdir(join(dir, "ckpt"));
    const held = `${process.ppid} ${hostname()}\n`; // alive, and not this process
    await writeFile(join(dir, "ckpt", "collector.pid"), held);
    expect(await collect("--run-url", `${base}/run`, "--http-url", base)).toBe(1);
    expect(stderr).toContain(`error checkpoint_conflict: another collector (pid ${process.ppid}) is running on ${join(dir, "ckpt")}`);
    expect((await readdir(join(dir, "ckpt"))).sort()).toEqual(["collector.pid"]);
    expect(existsSync(join(dir, "results.jsonl"))).toBe(false);
  });

  it("takes over the collector.pid of a process that no longer runs, and removes it at the end", async () => {
    const base = await serve();
    await mkdir(join(dir, "ckpt"));
    const dead = spawnSync(process.execPath, ["-e", ""]).pid;
    await writeFile(join(dir, "ckpt", "collector.pid"), `${dead} ${hostname()}\n`);
    expect(await collect("--run-url", `${base}/run`, "--http-url", base)).toBe(0);
    expect(existsSync(join(dir, "ckpt", "collector.pid"))).toBe(false);
  });
});

describe("gym-ckpt collect: another collection in the same checkpoint root", () => {
  it("after one that finished every row it sent, starts without --new-collection", async () => {
    const base = await serve();
    expect(await collect("--run-url", `${base}/run`, "--http-url", base)).toBe(0);
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--out", join(dir, "results-2.jsonl"), "--rollout-id-prefix", "b.")).toBe(0);
    expect([...(await readResults(join(dir, "results-2.jsonl"))).keys()]).toEqual(["b.a"]);
  });

  it("is refused (checkpoint_conflict, exit 1) naming the earlier one and both ways on; --new-collection starts it, and the log's header names it", async () => {
    const base = await serve();
    expect(await collect("--run-url", `${base}/run`, "--http-url", base)).toBe(0);
    const log = join(dir, "ckpt", "dispatched.jsonl");
    const header = async () => JSON.parse((await readFile(log, "utf8")).split("\n")[0]!) as Record<string, unknown>;
    const first = await header();
    expect(first).toMatchObject({ tasks: join(dir, "tasks.jsonl"), out: join(dir, "results.jsonl") });
    // A row still in flight when it ended (killed): not finished, so the next collection must say so.
    await appendFile(log, `${JSON.stringify({ rollout_id: "z", attempt: 0 })}\n`);
    stderr = "";
    const second = ["--out", join(dir, "results-2.jsonl"), "--rollout-id-prefix", "b."];
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, ...second)).toBe(1);
    expect(stderr).toContain(`error checkpoint_conflict: ${log} is another collection's (run ${String(first.run_id)}: --tasks ${join(dir, "tasks.jsonl")} --out ${join(dir, "results.jsonl")})`);
    expect(stderr).toContain("run its command again");
    expect(stderr).toContain("pass --new-collection");
    expect(existsSync(join(dir, "results-2.jsonl"))).toBe(false);
    expect(await header()).toEqual(first);
    process.exitCode = undefined; // the refusal's
    // --new-collection retires and forgets z@0 (the fake coordinator above answers both).
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, ...second, "--new-collection")).toBe(0);
    expect([...(await readResults(join(dir, "results-2.jsonl"))).keys()]).toEqual(["b.a"]);
    const next = await header();
    expect(next.run_id).not.toBe(first.run_id);
    expect(next).toMatchObject({ tasks: join(dir, "tasks.jsonl"), out: join(dir, "results-2.jsonl"), rollout_id_prefix: "b." });
    // A restart whose command keeps the flag (a requeued job) is not refused by its own log.
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, ...second, "--new-collection")).toBe(0);
    expect((await header()).run_id).not.toBe(first.run_id);
  });
});

describe("gym-ckpt collect: rollout records", () => {
  const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };

  it("tries a failed final flush again and reports the failed one", async () => {
    const records = join(dir, "records");
    // Something is in the way of step_1 once the collection runs: the first try of the last flush fails.
    const base = await serve(async () => {
      await writeFile(join(records, "rollouts", "step_1"), "x");
      return { reward: 1, trajectory };
    });
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--records-dir", records)).toBe(0);
    expect(stdout).toContain("rollout records: 1 in 1 step files, 1 failed flushes\n");
    expect((await readdir(join(records, "rollouts"))).sort()).toEqual(["step_1", "step_2"]);
  });

  it("exits 1 naming the finished rows whose records no flush could write", async () => {
    const records = join(dir, "records");
    const base = await serve(async () => {
      for (const step of [1, 2, 3]) await writeFile(join(records, "rollouts", `step_${step}`), "x");
      return { reward: 1, trajectory };
    });
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--records-dir", records)).toBe(1);
    expect(stdout).toContain("rollout records: 0 in 0 step files, 3 failed flushes; 1 finished rows NOT written (they are in --out only)\n");
  });
});
