import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * `gym-ckpt coordinator --token T --controller-token C` (the command line docs/telemetry.md shows)
 * with Prometheus /metrics on: the OTel SDK's process resource detector puts the whole argv in
 * `process.command_args`, which the Prometheus exporter serves in `target_info` (and OTLP sends
 * with every batch). A token must never leave the process that way.
 */
const TOKEN = "argv-secret-participant-token";
const CONTROLLER_TOKEN = "argv-secret-controller-token";

let nats: NatsFixture;
let root: string;
let daemon: DaemonProcess | undefined;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-argv-"));
}, 30_000);

afterAll(async () => {
  await daemon?.kill("SIGTERM").catch(() => undefined);
  await nats?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
});

describe("telemetry resource attributes", () => {
  it("/metrics does not carry the tokens given as flags", async () => {
    daemon = spawnDaemon(
      [MAIN, "coordinator", "--deployment", `argv${process.pid}`, "--nats-url", nats.server.url, "--token", TOKEN, "--controller-token", CONTROLLER_TOKEN, "--checkpoint-root", root, "--no-http", "--metrics-port", "0", "--log-level", "warn"],
      { GYM_CKPT_TOKEN: "", GYM_CKPT_CONTROLLER_TOKEN: "" },
    );
    const d = daemon;
    let url: string | undefined;
    for (const until = Date.now() + 20_000; !url && Date.now() < until; ) {
      url = /^metrics (\S+)$/m.exec(d.stdout())?.[1];
      if (!url) await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect(url, d.stderr()).toBeDefined();
    const text = await (await fetch(url!)).text();
    expect(text).toContain("target_info");
    expect(text).not.toContain(TOKEN);
    expect(text).not.toContain(CONTROLLER_TOKEN);
  }, 40_000);
});
