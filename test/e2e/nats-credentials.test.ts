import { execFile } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { natsServers, natsSettings } from "../../protocol/index.js";
import { NatsServerProcess } from "../../coordinator/local/nats-server-process.js";
import { cli, ensureBuilt, MAIN, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";
import { spawnServer, type SpawnedServer } from "./model-processes.js";
import { waitUntil } from "../support/wait-until.js";

/** A nats-server that requires a user and password: every process takes them from GYM_CKPT_NATS_USER/PASS. */
const CREDENTIALS = { GYM_CKPT_NATS_USER: "gym", GYM_CKPT_NATS_PASS: "s3cret-pass" };
const TOKEN = "participant-token";
const CONTROLLER = "controller-token";

let server: NatsServerProcess;
let root: string;
let env: Record<string, string>;
const stops: (() => Promise<void>)[] = [];

beforeAll(async () => {
  ensureBuilt();
  server = await NatsServerProcess.start({ args: ["--user", CREDENTIALS.GYM_CKPT_NATS_USER, "--pass", CREDENTIALS.GYM_CKPT_NATS_PASS] });
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-nats-auth-"));
  env = { GYM_CKPT_NATS_URL: server.url, GYM_CKPT_DEPLOYMENT: "authdep", GYM_CKPT_CONTROLLER_TOKEN: CONTROLLER };
});
afterAll(async () => {
  for (const stop of stops.reverse()) await stop().catch(() => undefined);
  await server?.dispose();
  await rm(root, { recursive: true, force: true });
});

describe("NATS credentials from the environment", () => {
  it("settings: comma-separated servers, credentials only when set; no server is invalid_request", () => {
    expect(natsSettings(" nats://a:1, nats://b:2 ,", {})).toEqual({ servers: ["nats://a:1", "nats://b:2"] });
    expect(natsSettings(undefined, { GYM_CKPT_NATS_URL: "nats://c:3", GYM_CKPT_NATS_TOKEN: "t", GYM_CKPT_NATS_USER: "" })).toEqual({ servers: ["nats://c:3"], token: "t" });
    expect(natsSettings(undefined, {}).servers).toEqual(["nats://127.0.0.1:4222"]);
    expect(() => natsServers(" , ")).toThrow(expect.objectContaining({ code: "invalid_request" }));
  });

  it("a participant server, the coordinator and the CLI all connect with them; without them the CLI is refused", async () => {
    const daemon: DaemonProcess = spawnDaemon(
      [MAIN, "coordinator", "--deployment", "authdep", "--nats-url", server.url, "--checkpoint-root", root, "--lease-ms", "500", "--no-http", "--log-level", "warn"],
      { ...CREDENTIALS, GYM_CKPT_TOKEN: TOKEN, GYM_CKPT_CONTROLLER_TOKEN: CONTROLLER },
    );
    stops.push(() => daemon.kill());
    const resources: SpawnedServer = await spawnServer(
      "resources",
      "dist/participants/gym/resources-server/main.js",
      ["--nats", server.url, "--deployment", "authdep", "--instance", "res-auth", "--port", "0", "--checkpoint-root", root],
      20_000,
      { ...CREDENTIALS, GYM_CKPT_TOKEN: TOKEN },
    );
    stops.push(() => resources.kill());
    // The CLI waits (leader wait) until the daemon serves, then lists the participant it registered.
    let status = await cli(["status", "--leader-wait-ms", "20000"], { ...env, ...CREDENTIALS });
    // The server may register after the daemon first answers: ask again until it is listed.
    await waitUntil(
      async () => {
        if (status.code !== 0 || status.stdout.includes("res-auth")) return true;
        status = await cli(["status"], { ...env, ...CREDENTIALS });
        return false;
      },
      "the participant to register",
      20_000,
    );
    expect([status.code, status.stderr]).toEqual([0, ""]);
    expect(status.stdout).toMatch(/resources\s+res-auth/);
    const refused = await cli(["status", "--leader-wait-ms", "0"], env);
    expect(refused.code).toBe(1);
    // A catalog code, not internal_error ("report a bug"): NATS refused the credentials.
    expect(refused.stderr).toMatch(/^error unauthorized: NATS at \S+ refused the connection's credentials \(.*authorization/i);
  });

  it("credentials NATS refuses at start-up are configuration: the coordinator and a participant exit 2 with one line", async () => {
    const wrong = { GYM_CKPT_NATS_USER: CREDENTIALS.GYM_CKPT_NATS_USER, GYM_CKPT_NATS_PASS: "wrong-pass", GYM_CKPT_TOKEN: TOKEN };
    // --metrics-port as in the systemd unit: its server must not keep the refused daemon alive.
    const daemon = await cli(["coordinator", "--deployment", "authdep", "--nats-url", server.url, "--checkpoint-root", root, "--no-http", "--metrics-port", "0"], wrong);
    expect(daemon.code).toBe(2);
    expect(daemon.stderr).toMatch(/^error unauthorized: NATS at nats:\/\/127\.0\.0\.1:\d+ refused the connection's credentials \([^\n]*authorization[^\n]*\); set GYM_CKPT_NATS_USER and GYM_CKPT_NATS_PASS, or GYM_CKPT_NATS_TOKEN\n$/i);
    const participant = await promisify(execFile)(process.execPath, ["dist/participants/gym/resources-server/main.js", "--nats", server.url, "--deployment", "authdep", "--metrics-port", "0"], {
      env: { ...process.env, ...wrong },
      timeout: 30_000,
    }).then(
      () => ({ code: 0, stderr: "" }),
      (error: { code?: number; stderr?: string }) => ({ code: error.code, stderr: error.stderr }),
    );
    expect(participant.code).toBe(2);
    expect(participant.stderr).toMatch(/^resources-server: unauthorized: NATS at nats:\/\/127\.0\.0\.1:\d+ refused the connection's credentials \([^\n]*authorization[^\n]*\);[^\n]*\n$/i);
  });
});
