import { appendFile, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { spawn } from "node:child_process";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../coordinator/publication/global-manifest-writer.js";
import { writeParticipant } from "../unit/coordinator/fake-participants.js";
import { CONTROLLER_TOKEN, PARTICIPANT_TOKEN, startWorld, type World } from "../integration/coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";
import { cli, daemonArgs, ensureBuilt, MAIN, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

let world: World;
let daemon: DaemonProcess;
let env: Record<string, string>;

beforeAll(async () => {
  ensureBuilt();
  world = await startWorld();
  await world.startParticipants();
  world.participant("policy").adapter.addEpisode({ rollout_id: "c1", attempt: 0 }, { t: 1 });
  // A 2 s lease, not daemonArgs' 500 ms: on a loaded machine a renewal held up a third of a second
  // demotes the daemon, and the term it starts next presumes the checkpoint a test prepared (in a
  // CLI process of its own) aborted, so that test's commit fails (the likely cause of one
  // 'fine-grained ops' failure in CI, exit 1 on commit; not reproduced).
  daemon = spawnDaemon(daemonArgs(world, ["--http-port", "0", "--lease-ms", "2000"]));
  env = { GYM_CKPT_NATS_URL: world.nats.server.url, GYM_CKPT_DEPLOYMENT: world.deployment, GYM_CKPT_CONTROLLER_TOKEN: CONTROLLER_TOKEN, GYM_CKPT_CHECKPOINT_ROOT: world.root };
});
afterAll(async () => {
  await daemon?.kill();
  await world?.close();
});

describe("gym-ckpt CLI (built binary)", () => {
  it("checkpoint, status table, ls and verify against a real daemon", async () => {
    const checkpoint = await cli(["checkpoint", "--id", "cli-1", "--json", "--state-json", '{"step":1}'], env);
    expect(checkpoint.stderr).toBe("");
    expect(checkpoint.code).toBe(0);
    expect(JSON.parse(checkpoint.stdout)).toMatchObject({ checkpoint_id: "cli-1", participants: 5 });

    const status = await cli(["status"], env);
    expect(status.code).toBe(0);
    const lines = status.stdout.trim().split("\n");
    expect(lines[1]).toMatch(/^KIND\s+INSTANCE\s+PHASE\s+LEASE\s+BLOCKERS$/);
    expect(lines.slice(2).map((l) => l.split(/\s+/).slice(0, 3).join(" "))).toEqual([
      "agent agent1 idle",
      "agent agent2 idle",
      "environment env1 idle",
      "model policy idle",
      "resources tools idle",
    ]);

    const ls = await cli(["ls"], env);
    expect(ls.code).toBe(0);
    expect(ls.stdout).toMatch(/^\* cli-1 /);

    const verify = await cli(["verify", "cli-1"], env);
    expect(verify.code).toBe(0);
    expect(verify.stdout).toContain("ok cli-1: 5 participants, 1 records");
  });

  it("fine-grained ops: prepare, commit, publish, resume; refusals exit non-zero naming the code", async () => {
    // On failure: the CLI's error, then the daemon's log (warnings: a lost lease, a recovery).
    const prepared = await cli(["prepare", "cli-2"], env);
    expect(prepared.code, prepared.stderr + daemon.stdout()).toBe(0);
    const wrong = await cli(["publish", "cli-2"], env);
    expect(wrong.code).toBe(1);
    expect(wrong.stderr).toMatch(/^error invalid_phase: /);
    const committed = await cli(["commit", "cli-2", "--episodes", "c1"], env);
    expect(committed.code, committed.stderr + daemon.stdout()).toBe(0);
    // A commit retried with another scope names the op in words ("commited" before).
    const otherScope = await cli(["commit", "cli-2", "--episodes", ""], env);
    expect([otherScope.code, otherScope.stderr]).toEqual([1, "error checkpoint_conflict: checkpoint cli-2 was already committed with other arguments\n"]);
    expect((await cli(["publish", "cli-2"], env)).code).toBe(0);
    expect((await cli(["resume", "cli-2"], env)).code).toBe(0);
    const unknown = await cli(["commit", "nope"], env);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/^error not_found: /);
    const badId = await cli(["prepare", "../x"], env);
    expect(badId.code).toBe(2);
    expect(badId.stderr).toMatch(/^error invalid_request: /);
    // Bad usage (commander's own checks, an unreadable --episodes file) is invalid_request, exit 2.
    for (const args of [
      ["status", "--bogus"],
      ["commit"],
      ["retire", "--episodes", "@/nonexistent/episodes.json"],
      ["status", "--leader-wait-ms", "soon"],
      ["status", "--leader-wait-ms", "0x10"],
      ["status", "--http-url", "localhost:8480"],
      ["status", "--http-url", "127.0.0.1:8480"],
    ]) {
      const usage = await cli(args, env);
      expect([usage.code, usage.stderr.split("\n")[0]]).toEqual([2, expect.stringMatching(/^error invalid_request: /)]);
    }
    const badToken = await cli(["status"], { ...env, GYM_CKPT_CONTROLLER_TOKEN: "wrong" });
    expect(badToken.stderr).toMatch(/^error unauthorized: /);
    const retire = await cli(["retire", "--episodes", "c1-a3"], env);
    expect(retire.code).toBe(0);
    expect(JSON.parse(retire.stdout).participants).toHaveLength(5);
    expect((await cli(["forget", "--rollouts", "c1"], env)).code).toBe(0);
  });

  it("an empty value is the value given, never the flag left out: an empty id is refused, an empty --episodes is an empty scope", async () => {
    const listed = (await cli(["ls", "--json"], env)).stdout;
    // `"$ID"` of an unset variable: not a generated id, not LATEST, not the default id.
    for (const args of [
      ["checkpoint", "--id", "", "--episodes", "c1"],
      ["restore", "", "--episodes", "c1"],
      ["retire", "--episodes", "c1-a5", "--id", ""],
      ["forget", "--rollouts", "c9", "--id", ""],
    ]) {
      const refused = await cli(args, env);
      expect([args, refused.code, refused.stderr]).toEqual([args, 2, expect.stringMatching(/^error invalid_request: checkpoint_id: /)]);
    }
    expect((await cli(["ls", "--json"], env)).stdout).toBe(listed);
    expect((await cli(["prepare", "cli-e2"], env)).code).toBe(0);
    const committed = await cli(["commit", "cli-e2", "--episodes", ""], env);
    expect([committed.code, committed.stderr]).toEqual([0, ""]);
    expect((JSON.parse(committed.stdout) as { participants: { episode_ids: string[] }[] }).participants.map((p) => p.episode_ids)).toEqual(Array(5).fill([]));
    expect((await cli(["resume", "cli-e2"], env)).code).toBe(0);
  });

  it("a bad checkpoint id given to verify, an empty --root and --episodes @ with no file say so in words (exit 2)", async () => {
    const verify = await cli(["verify", ""], env);
    expect([verify.code, verify.stderr.split("\n")[0]]).toEqual([2, expect.stringMatching(/^error invalid_request: checkpoint id "": /)]);
    expect(verify.stderr).not.toContain("(root)");
    const emptyRoot = await cli(["ls", "--root", ""], { ...env, GYM_CKPT_CHECKPOINT_ROOT: "/tmp" });
    expect([emptyRoot.code, emptyRoot.stderr]).toEqual([2, "error invalid_request: --root names no directory (an empty path)\n"]);
    const episodes = await cli(["retire", "--episodes", "@"], env);
    expect([episodes.code, episodes.stderr.split("\n")[0]]).toEqual([2, "error invalid_request: --episodes @ names no file (write @<path to a JSON array>)"]);
  });

  it("output to a reader that went away (`| head`) is dropped quietly: no EPIPE stack trace, the command's own exit code", async () => {
    const child = spawn(process.execPath, [MAIN, "status", "--json"], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.destroy(); // the reader's end is closed before the command writes its reply
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.once("close", resolve));
    expect([code, stderr]).toEqual([0, ""]);
  });

  it("an explicit --nats-url beats GYM_CKPT_HTTP_URL from the environment", async () => {
    const viaEnv = { ...env, GYM_CKPT_HTTP_URL: "http://127.0.0.1:1" }; // an env file's HTTP URL, here one nobody serves
    const status = await cli(["status", "--json", "--nats-url", world.nats.server.url], viaEnv);
    expect([status.code, status.stderr]).toEqual([0, ""]);
    expect(JSON.parse(status.stdout).participants).toHaveLength(5);
  });

  it("an empty --token (an unset \"$TOKEN\") is invalid_request (exit 2), not taken for no token", async () => {
    const refused = await cli(["status", "--token", ""], env);
    expect([refused.code, refused.stderr]).toEqual([2, "error invalid_request: --token is empty (an unset variable?): pass the controller token, or leave the flag out to use GYM_CKPT_CONTROLLER_TOKEN\n"]);
  });

  it("verify exits 1 naming invalid_checkpoint_state when a record changed", async () => {
    const dir = join(world.root, "cli-1", "gym", "model", "policy");
    const records = (await readdir(dir)).find((n) => n.startsWith("records-"))!;
    await appendFile(join(dir, records), '{"episode_id":{"rollout_id":"zz","attempt":0}}\n');
    const verify = await cli(["verify", "cli-1"], env);
    expect(verify.code).toBe(1);
    expect(verify.stderr).toMatch(/^error invalid_checkpoint_state: model\/policy: records digest/);
    const missing = await cli(["verify", "never"], env);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^error not_found: /);
  });

  it("ls of a missing root and verify LATEST of a root without LATEST are not_found (exit 1)", async () => {
    const empty = await mkdtemp(join(tmpdir(), "gym-ckpt-cli-empty-"));
    try {
      const latest = await cli(["verify", "LATEST", "--root", empty]);
      expect([latest.code, latest.stderr]).toEqual([1, `error not_found: nothing is published under ${empty}: it has no LATEST\n`]);
      const absent = join(empty, "absent");
      const ls = await cli(["ls", "--root", absent]);
      expect([ls.code, ls.stdout, ls.stderr]).toEqual([1, "", `error not_found: no checkpoint root at ${absent}\n`]);
      const lsJson = await cli(["ls", "--json", "--root", absent]);
      expect([lsJson.code, lsJson.stdout]).toEqual([1, ""]);
      // An existing root with nothing published lists nothing.
      expect(await cli(["ls", "--root", empty])).toEqual({ code: 0, stdout: "", stderr: "" });
    } finally {
      await rm(empty, { recursive: true, force: true });
    }
  });

  it("ls of a root whose LATEST is damaged still lists every checkpoint, none marked, with a warning (exit 0)", async () => {
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-cli-latest-"));
    try {
      const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
      for (const [id, at] of [["c1", 2], ["c2", 3]] as const) {
        const entry = await writeParticipant(root, id, "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
        await writer.publish({ checkpointId: id, epoch: 1, preparedAt: 1, publishedAt: at, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
      }
      await writer.settled();
      expect((await cli(["ls", "--root", root])).stdout).toMatch(/^\* c2 .*\n  c1 /);
      await writeFile(join(root, "LATEST"), "../c2\n");
      const ls = await cli(["ls", "--root", root]);
      expect([ls.code, ls.stderr]).toEqual([0, "warning invalid_checkpoint_state: LATEST does not name a checkpoint id (no checkpoint is marked LATEST)\n"]);
      expect(ls.stdout).toMatch(/^  c2 .*\n  c1 /);
      const json = await cli(["ls", "--json", "--root", root]);
      expect(JSON.parse(json.stdout)).toMatchObject({ latest: null, latest_error: { code: "invalid_checkpoint_state" }, checkpoints: [{ checkpoint_id: "c2" }, { checkpoint_id: "c1" }] });
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });

  it("a NATS nobody serves is not_leader (exit 1), for a client command and for the daemon; credentials in the URL are not printed", async () => {
    const status = await cli(["status", "--nats-url", "nats://ops:hunter2@127.0.0.1:1"], env);
    expect([status.code, status.stderr]).toEqual([1, expect.stringMatching(/^error not_leader: cannot reach NATS at nats:\/\/\[Redacted\]@127\.0\.0\.1:1 \(connection refused\): no coordinator can be asked/)]);
    expect(status.stderr).not.toContain("hunter2");
    // A request its schema refuses is refused before anything is connected: the same exit 2 whether
    // or not NATS (or the HTTP API) answers, not not_leader while it is down.
    for (const where of [["--nats-url", "nats://127.0.0.1:1"], ["--http-url", "http://127.0.0.1:1"]]) {
      const badId = await cli(["commit", "../x", ...where, "--leader-wait-ms", "0"], env);
      expect([where, badId.code, badId.stderr.split("\n")[0]]).toEqual([where, 2, expect.stringMatching(/^error invalid_request: checkpoint_id: /)]);
    }
    // Tried once (the start's wait for a NATS server that is restarting is test/e2e/start-before-nats.test.ts's).
    const started = await cli(["coordinator", "--deployment", world.deployment, "--nats-url", "nats://127.0.0.1:1", "--token", "t", "--checkpoint-root", world.root, "--no-http", "--log-level", "silent"], { GYM_CKPT_NATS_CONNECT_WAIT_MS: "0" });
    expect([started.code, started.stderr]).toEqual([1, expect.stringMatching(/^error not_leader: cannot reach NATS at nats:\/\/127\.0\.0\.1:1 .*this coordinator cannot start/)]);
  });

  it("coordinator --print-config redacts secrets; bad config is a readable error (exit 2)", async () => {
    const printed = await cli(daemonArgs(world, ["--print-config"]).slice(1));
    expect(printed.code).toBe(0);
    expect(printed.stdout).not.toContain(PARTICIPANT_TOKEN);
    expect(printed.stdout).not.toContain(CONTROLLER_TOKEN);
    expect(JSON.parse(printed.stdout)).toMatchObject({ token: "[Redacted]", controller_token: "[Redacted]", lease_ms: 500, deployment: world.deployment });
    const file = join(world.root, "bad-config.json");
    await writeFile(file, JSON.stringify({ retention: 0, unknown_key: 1 }));
    const bad = await cli(["coordinator", "--config", file, "--print-config"], { GYM_CKPT_TOKEN: "x", GYM_CKPT_CHECKPOINT_ROOT: "relative" });
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("invalid configuration");
    expect(bad.stderr).toContain("retention");
    expect(bad.stderr).toContain("checkpoint_root");
    expect(bad.stderr).toContain("unknown_key");
    const spaced = await cli(daemonArgs(world, ["--controller-token", "two words", "--print-config"]).slice(1));
    expect([spaced.code, spaced.stdout]).toEqual([2, ""]);
    expect(spaced.stderr).toMatch(/^error invalid_request: invalid configuration:[^]*whitespace[^]*controller_token/);
    const hexPort = await cli(daemonArgs(world, ["--http-port", "0x10", "--print-config"]).slice(1));
    expect([hexPort.code, hexPort.stderr.trim()]).toEqual([2, 'error invalid_request: --http-port must be a decimal integer, got "0x10"']);
    const badPort = await cli(daemonArgs(world, ["--metrics-port", "70000", "--print-config"]).slice(1));
    expect([badPort.code, badPort.stderr.trim()]).toEqual([2, 'error invalid_request: --metrics-port must be an integer from 0 to 65535, got "70000"']);
  });

  it("an OTEL_EXPORTER_PROMETHEUS_PORT that is not a port is refused like --metrics-port (exit 2: not restarted), before the daemon connects", async () => {
    for (const port of ["abc", "99999", "-1"]) {
      const refused = await cli(daemonArgs(world, ["--http-port", "0"]).slice(1), { OTEL_EXPORTER_PROMETHEUS_PORT: port });
      expect([refused.code, refused.stderr.trim()]).toEqual([2, `error invalid_request: OTEL_EXPORTER_PROMETHEUS_PORT must be an integer from 0 to 65535 (0 = any free port), got ${JSON.stringify(port)}`]);
    }
  });

  it("over HTTP, waits for the reply until the op's deadline, past the HTTP stack's own 300 s reply timeout", async () => {
    // In the CLI process a preload makes timers ~500× faster (undici's clock ticks every 499 ms, now
    // every ~1 ms) and marks when 1200 such ticks (10 minutes there) have passed; the fake
    // coordinator answers only then. The request's own deadline (an AbortSignal) is not scaled.
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-fast-timers-"));
    const mark = join(dir, "ten-minutes");
    const preload = join(dir, "fast-timers.mjs");
    await writeFile(
      preload,
      [
        `import { writeFileSync } from "node:fs";`,
        `const real = globalThis.setTimeout;`,
        `globalThis.setTimeout = (fn, ms, ...args) => real(fn, Math.ceil((ms ?? 0) / 500), ...args);`,
        `let ticks = 0;`,
        `const tick = () => (++ticks === 1200 ? writeFileSync(${JSON.stringify(mark)}, "") : real(tick, 1).unref());`,
        `real(tick, 1).unref();`,
      ].join("\n"),
    );
    const server = createServer((_req, res) => {
      void waitUntil(() => existsSync(mark), "ten minutes of the CLI's timers").then(
        () => res.writeHead(409, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "prepare_incomplete", detail: "environment/env1: 1 blocker" } })),
        () => res.destroy(),
      );
    });
    try {
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const result = await cli(["prepare", "slow-1", "--timeout-s", "3600", "--http-url", url], { ...env, NODE_OPTIONS: `--import ${pathToFileURL(preload).href}` });
      expect({ code: result.code, stderr: result.stderr.split("\n")[0] }).toEqual({ code: 1, stderr: "error prepare_incomplete: environment/env1: 1 blocker" });
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("a checkpoint whose gym/ path holds a file (or a link) is refused before anyone is prepared: the id stays usable once it is moved", async () => {
    for (const [id, block] of [
      ["cli-gym-file", (path: string) => writeFile(path, "x")],
      ["cli-gym-link", (path: string) => symlink(tmpdir(), path)],
    ] as const) {
      await mkdir(join(world.root, id));
      await block(join(world.root, id, "gym"));
      const refused = await cli(["checkpoint", "--id", id, "--episodes", ""], env);
      expect([refused.code, refused.stdout, refused.stderr]).toEqual([1, "", `error checkpoint_conflict: ${join(world.root, id, "gym")} exists and is not a directory: move it, or use another checkpoint id\n`]);
      // Nothing was sent: no participant was parked and resumed, which would fence the id (stale_checkpoint below).
      await rm(join(world.root, id, "gym"));
      const again = await cli(["checkpoint", "--id", id, "--episodes", "", "--json"], env);
      expect([again.code, again.stderr]).toEqual([0, ""]);
      expect(JSON.parse(again.stdout)).toMatchObject({ checkpoint_id: id });
    }
  });

  it("the daemon prints its HTTP address (127.0.0.1) and stops cleanly on SIGTERM", async () => {
    const url = /http (http:\/\/\S+)/.exec(daemon.stdout())?.[1];
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const via = await cli(["status", "--http-url", url!, "--json"], env);
    expect(via.code).toBe(0);
    expect(JSON.parse(via.stdout).participants).toHaveLength(5);
    await daemon.kill("SIGTERM");
    expect(await daemon.exited).toEqual({ code: 0, signal: null });
  });
});
