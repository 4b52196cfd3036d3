import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * A daemon whose start-up fails after it connected to NATS (checkpoint_root cannot be created,
 * NATS without JetStream, ...) prints the refusal and must exit, so its supervisor sees the failure.
 * The open NATS connection used to keep the process alive for ever.
 */
let nats: NatsFixture | undefined;
let dir: string;
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
});

describe("coordinator start-up failure", () => {
  it("exits non-zero when checkpoint_root cannot be created (after connecting to NATS)", async () => {
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
});
