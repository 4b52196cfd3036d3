import { lookup } from "node:dns/promises";
import { chmod, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT_DEPLOYMENT_FILE } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { MAIN, asAccount, cli, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

// RFC 6761: .invalid never resolves, so a working resolver answers ENOTFOUND. A machine whose
// resolver cannot be reached answers EAI_AGAIN instead (which stays exit 1: a restart may find it
// back), and the host-name case below cannot be shown there: it runs only where ENOTFOUND comes.
const UNRESOLVABLE = "no-such-host.invalid";
const resolverSays = await Promise.race([
  lookup(UNRESOLVABLE).then(() => "resolved", (error: NodeJS.ErrnoException) => error.code ?? "failed"),
  new Promise<string>((resolve) => setTimeout(() => resolve("no answer"), 5000).unref()),
]);

/**
 * A daemon whose start-up fails (checkpoint_root cannot be created, before it connects;
 * NATS without JetStream, ...) prints the refusal and must exit, so its supervisor sees the failure.
 * The open NATS connection used to keep the process alive for ever.
 */
let nats: NatsFixture | undefined;
let dir: string;
/** Traversable by every account (the run's TMPDIR is root's 0700): for a daemon run as another uid. */
let shared: string | undefined;
const daemons: DaemonProcess[] = [];

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-startfail-"));
});

afterAll(async () => {
  await Promise.allSettled(daemons.map((d) => d.kill()));
  await nats?.close().catch(() => undefined);
  if (dir) await rm(dir, { recursive: true, force: true });
  if (shared) await rm(shared, { recursive: true, force: true });
});

describe("coordinator start-up failure", () => {
  it("exits non-zero when checkpoint_root cannot be created (NATS up)", async () => {
    await writeFile(join(dir, "a-file"), "x");
    const daemon = spawnDaemon([
      MAIN, "coordinator", "--deployment", `startfail${process.pid}`, "--nats-url", nats!.server.url, "--token", "t",
      "--checkpoint-root", join(dir, "a-file", "root"), "--no-http", "--log-level", "warn",
    ]);
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(daemon.stderr()).toMatch(/^error invalid_request: checkpoint_root .*ENOTDIR/m);
    expect(outcome).not.toBe("still running");
    expect((outcome as { code: number }).code).toBe(2); // configuration: a supervisor should not restart it
  }, 20_000);

  it("exits 2 naming http.port when the HTTP API's port is taken (configuration, as --metrics-port), before it campaigns", async () => {
    const taken = createServer();
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", () => resolve()));
    const port = (taken.address() as { port: number }).port;
    try {
      const daemon = spawnDaemon([
        MAIN, "coordinator", "--deployment", `starthttp${process.pid}`, "--nats-url", nats!.server.url, "--token", "t",
        "--checkpoint-root", join(dir, "http-root"), "--http-port", String(port), "--log-level", "warn",
      ]);
      daemons.push(daemon);
      const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 15_000).unref())]);
      expect(daemon.stderr()).toMatch(new RegExp(`^error invalid_request: http\\.port ${port}: cannot listen on 127\\.0\\.0\\.1:${port} \\(EADDRINUSE: address already in use\\)$`, "m"));
      expect(outcome).toEqual({ code: 2, signal: null });
    } finally {
      await new Promise((resolve) => taken.close(resolve));
    }
  }, 30_000);

  it.runIf(resolverSays === "ENOTFOUND")("exits 2 naming http.port when the HTTP API's host name does not resolve (configuration, as a taken port), not internal_error", async () => {
    const daemon = spawnDaemon([
      MAIN, "coordinator", "--deployment", `starthost${process.pid}`, "--nats-url", nats!.server.url, "--token", "t",
      "--checkpoint-root", join(dir, "host-root"), "--http-host", UNRESOLVABLE, "--http-port", "0", "--log-level", "warn",
    ]);
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 15_000).unref())]);
    expect(daemon.stderr()).toMatch(/^error invalid_request: http\.port 0: cannot listen on no-such-host\.invalid:0 \(ENOTFOUND: no such host name\)$/m);
    expect(outcome).toEqual({ code: 2, signal: null });
  }, 30_000);

  it("exits 2 for a checkpoint_root that cannot be created before it connects: NATS down does not hide it behind exit 1", async () => {
    await writeFile(join(dir, "another-file"), "x");
    // Port 1: nothing listens, so a connect first would answer not_leader (exit 1), restarted for ever.
    const daemon = spawnDaemon([
      MAIN, "coordinator", "--deployment", `startnonats${process.pid}`, "--nats-url", "nats://127.0.0.1:1", "--token", "t",
      "--checkpoint-root", join(dir, "another-file", "root"), "--no-http", "--log-level", "warn",
    ]);
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(outcome).not.toBe("still running");
    expect(daemon.stderr()).toMatch(/^error invalid_request: checkpoint_root .*ENOTDIR/m);
    expect((outcome as { code: number }).code).toBe(2);
  }, 20_000);

  it("exits 2 for an invalid GYM_CKPT_NATS_REPLICAS before it connects: NATS down does not hide it behind exit 1", async () => {
    const daemon = spawnDaemon(
      [MAIN, "coordinator", "--deployment", `startreplicas${process.pid}`, "--nats-url", "nats://127.0.0.1:1", "--token", "t", "--checkpoint-root", join(dir, "replicas-root"), "--no-http", "--log-level", "warn"],
      { GYM_CKPT_NATS_REPLICAS: "9" },
    );
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(outcome).not.toBe("still running");
    expect(daemon.stderr()).toMatch(/^error invalid_request: GYM_CKPT_NATS_REPLICAS must be a whole number from 1 to 5/m);
    expect((outcome as { code: number }).code).toBe(2);
  }, 20_000);

  it("exits 2 for an empty --otlp-endpoint, refused like any other value that is no URL instead of dropped", async () => {
    const daemon = spawnDaemon([
      MAIN, "coordinator", "--deployment", `startotlp${process.pid}`, "--nats-url", nats!.server.url, "--token", "t",
      "--checkpoint-root", join(dir, "otlp-root"), "--no-http", "--log-level", "warn", "--otlp-endpoint", "",
    ]);
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(outcome).not.toBe("still running");
    expect(daemon.stderr()).toMatch(/^error invalid_request: --otlp-endpoint must be an http:\/\/ or https:\/\/ URL/m);
    expect((outcome as { code: number }).code).toBe(2);
  }, 20_000);

  it("exits 2 when mkdir answers ENOENT under an existing parent (/proc), instead of spinning in Node's recursive mkdir", async () => {
    const daemon = spawnDaemon([
      MAIN, "coordinator", "--deployment", `startproc${process.pid}`, "--nats-url", nats!.server.url, "--token", "t",
      "--checkpoint-root", `/proc/gym-ckpt-${process.pid}/root`, "--no-http", "--log-level", "warn",
    ]);
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(outcome).not.toBe("still running");
    // The errno once, as Node's message says it ("ENOENT: no such file or directory, mkdir …").
    expect(daemon.stderr()).toMatch(new RegExp(`^error invalid_request: checkpoint_root /proc/gym-ckpt-${process.pid}/root cannot be created \\(ENOENT: no such file or directory, mkdir '/proc/gym-ckpt-${process.pid}'\\)$`, "m"));
    expect((outcome as { code: number }).code).toBe(2);
  }, 20_000);

  it("exits 2 for a checkpoint_root no directory can have: through a symbolic-link loop (ELOOP) or a name too long (ENAMETOOLONG)", async () => {
    await symlink(join(dir, "loop"), join(dir, "loop"));
    for (const [name, root, errno] of [
      ["loop", join(dir, "loop", "root"), "ELOOP"],
      ["long", join(dir, "n".repeat(300), "root"), "ENAMETOOLONG"],
    ] as const) {
      const daemon = spawnDaemon([
        MAIN, "coordinator", "--deployment", `start${name}${process.pid}`, "--nats-url", nats!.server.url, "--token", "t",
        "--checkpoint-root", root, "--no-http", "--log-level", "warn",
      ]);
      daemons.push(daemon);
      const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
      expect(outcome).not.toBe("still running");
      // Configuration, as ENOENT and ENOTDIR are: neither the storage (storage_error) nor a bug (internal_error), and no restart helps.
      expect(daemon.stderr()).toMatch(new RegExp(`^error invalid_request: checkpoint_root .*${errno}`, "m"));
      expect((outcome as { code: number }).code).toBe(2);
    }
  }, 30_000);

  it("exits 2 on a checkpoint_root another deployment claimed, before it connects (NATS down does not hide it)", async () => {
    const root = join(dir, "claimed-root");
    await mkdir(root);
    await writeFile(join(root, ROOT_DEPLOYMENT_FILE), `${JSON.stringify({ deployment: "job" })}\n`);
    const daemon = spawnDaemon([MAIN, "coordinator", "--deployment", "job-1", "--nats-url", "nats://127.0.0.1:1", "--token", "t", "--checkpoint-root", root, "--no-http", "--log-level", "warn"]);
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(outcome).not.toBe("still running");
    expect(daemon.stderr()).toMatch(new RegExp(`^error invalid_request: checkpoint_root ${root} holds the checkpoints of deployment "job" \\(\\.gym-ckpt-deployment\\.json\\), not of this coordinator's deployment "job-1": `, "m"));
    expect((outcome as { code: number }).code).toBe(2);
  }, 20_000);

  // An empty mount point (the storage not mounted yet) is neither claimed nor written: exit 1, which
  // the supervisor restarts until the storage is back.
  it("exits 1 with --require-existing-root-claim on a root that holds no claim, before it connects, writing nothing there", async () => {
    const root = join(dir, "empty-mount-point");
    await mkdir(root);
    const daemon = spawnDaemon([MAIN, "coordinator", "--deployment", "job", "--nats-url", "nats://127.0.0.1:1", "--token", "t", "--checkpoint-root", root, "--require-existing-root-claim", "--no-http", "--log-level", "warn"]);
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(outcome).not.toBe("still running");
    expect(daemon.stderr()).toMatch(new RegExp(`^error storage_error: ENOENT: checkpoint_root ${root} holds no \\.gym-ckpt-deployment\\.json .*require_existing_root_claim is set`, "m"));
    expect((outcome as { code: number }).code).toBe(1);
    expect(await readdir(root)).toEqual([]);
  }, 20_000);

  it("exits 2 when checkpoint_root exists but this account cannot write it, instead of serving as ready", async () => {
    // Root writes through mode bits, so as root the daemon runs as another account (as the systemd
    // unit's gym-ckpt user does); otherwise this user's own read-only directory is enough.
    const asRoot = process.getuid?.() === 0;
    let base = dir;
    if (asRoot) {
      shared = await mkdtemp("/tmp/gym-ckpt-startfail-");
      await chmod(shared, 0o755);
      base = shared;
    }
    const root = join(base, "read-only");
    await mkdir(root, { mode: 0o555 });
    await chmod(root, 0o555);
    const daemon = spawnDaemon(
      [MAIN, "coordinator", "--deployment", `startro${process.pid}`, "--nats-url", nats!.server.url, "--token", "t", "--checkpoint-root", root, "--no-http", "--log-level", "warn"],
      { HOME: "/" },
      asRoot ? asAccount({ uid: 64_991, gid: 64_991, umask: 0o022 }) : [],
    );
    daemons.push(daemon);
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    expect(daemon.stderr()).toMatch(/^error invalid_request: checkpoint_root .* is not writable .*EACCES/m);
    expect(outcome).not.toBe("still running");
    expect((outcome as { code: number }).code).toBe(2);
  }, 20_000);

  it("exits 1 when --nats-url names a port that accepts but never speaks NATS (the first connect times out), as does a client command", async () => {
    // nats.js's connect gave up after 20 s and the refusal was printed, but the socket it opened
    // stayed open and kept the process alive for ever: a supervisor never restarted the daemon.
    const accepted: Socket[] = [];
    const silent = createServer((socket) => {
      accepted.push(socket);
      socket.on("error", () => undefined);
    });
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    const url = `nats://127.0.0.1:${(silent.address() as { port: number }).port}`;
    // The same timeout path as nats.js's 20 s default, only sooner: the connect still times out after
    // the TCP connection was accepted. A connect wait of 0 keeps the daemon to its one try, as 20 s
    // past its default 10 s wait does.
    const timeout = { GYM_CKPT_NATS_CONNECT_TIMEOUT_MS: "2000" };
    try {
      const daemon = spawnDaemon(
        [MAIN, "coordinator", "--deployment", `startsilent${process.pid}`, "--nats-url", url, "--token", "t", "--checkpoint-root", join(dir, "silent"), "--no-http", "--log-level", "warn"],
        { ...timeout, GYM_CKPT_NATS_CONNECT_WAIT_MS: "0" },
      );
      daemons.push(daemon);
      const status = cli(["status", "--nats-url", url, "--token", "t"], timeout);
      const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 35_000).unref())]);
      expect(daemon.stderr()).toMatch(/^error not_leader: cannot reach NATS at nats:\/\/127\.0\.0\.1:\d+ \(timeout\): this coordinator cannot start/m);
      expect(outcome).toEqual({ code: 1, signal: null });
      // cli() gives up after 30 s (CLI_NO_EXIT, not 1): the command must have ended by itself.
      const command = await status;
      expect(command.stderr).toMatch(/^error not_leader: cannot reach NATS at \S+ \(timeout\)/);
      expect(command.code).toBe(1);
    } finally {
      for (const socket of accepted) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    }
  }, 60_000);
});
