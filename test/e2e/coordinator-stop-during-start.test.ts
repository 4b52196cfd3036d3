import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Subscription } from "@nats-io/transport-node";
import { Kvm } from "@nats-io/kv";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { openMembersBucket } from "../../coordinator/membership/members-bucket.js";
import { PROTOCOL_VERSION, leaderBucket, memberKey, participantSubject } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startStallProxy, type StallProxy } from "../support/stall-proxy.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * A SIGTERM (a supervisor's stop, a deploy) may arrive while the daemon starts. Once its lease
 * campaign created the leader key, Node's default action would leave that key held for a whole
 * lease, and every successor would wait it out.
 */
let nats: NatsFixture;
let root: string;
const daemons: DaemonProcess[] = [];
const cleanups: (() => Promise<unknown> | unknown)[] = [];
let counter = 0;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-stop-start-"));
});

afterEach(async () => {
  await Promise.all(daemons.splice(0).map((daemon) => daemon.kill().catch(() => undefined)));
  for (const cleanup of cleanups.splice(0)) await cleanup();
});

afterAll(async () => {
  await nats?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
});

function daemonArgs(deployment: string, natsUrl: string, leaseMs: number): string[] {
  return [MAIN, "coordinator", "--deployment", deployment, "--nats-url", natsUrl, "--token", "t", "--checkpoint-root", join(root, deployment), "--lease-ms", String(leaseMs), "--no-http", "--log-level", "warn"];
}

/**
 * Registers a participant that takes status requests and answers none: a winning campaign's epoch
 * floor probe (after the key's create) waits for it up to 2 s. `probed` resolves at its first request.
 */
async function silentMember(deployment: string): Promise<{ probed: Promise<void> }> {
  const members = await openMembersBucket(nats.nc, deployment);
  const now = Date.now() / 1000;
  const member = { kind: "environment", instance: "silent", incarnation: "silent-1", started_at: now, heartbeat_at: now, protocol_version: PROTOCOL_VERSION };
  await members.put(memberKey("environment", "silent"), JSON.stringify(member));
  let sub: Subscription | undefined;
  const probed = new Promise<void>((resolve) => (sub = nats.nc.subscribe(participantSubject(deployment, "environment", "silent", "status"), { callback: () => resolve() })));
  await nats.nc.flush();
  cleanups.push(() => sub?.unsubscribe());
  return { probed };
}

const leaderKey = async (deployment: string) => (await (await new Kvm(nats.nc).open(leaderBucket(deployment))).get("coordinator"))?.operation;

/** `probed`, failing with the daemon's stderr should it exit first. */
const untilProbed = (probed: Promise<void>, daemon: DaemonProcess) => Promise.race([probed, daemon.exited.then(() => Promise.reject(new Error(`the daemon exited: ${daemon.stderr()}`)))]);

const exitWithin = (daemon: DaemonProcess, ms: number) =>
  Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), ms).unref())]);

describe("coordinator stop signal during start-up", () => {
  it("a SIGTERM after the campaign created the leader key stops the daemon once start-up settles, releasing the key", async () => {
    const deployment = `stopstart${process.pid}x${counter++}`;
    const { probed } = await silentMember(deployment);
    const daemon = spawnDaemon(daemonArgs(deployment, nats.server.url, 20_000));
    daemons.push(daemon);
    await untilProbed(probed, daemon); // inside the campaign, its key created, start-up not returned
    expect(await leaderKey(deployment)).toBe("PUT");
    daemon.child.kill("SIGTERM");
    // Before: killed by the signal, its key held for the whole 20 s lease.
    expect(await exitWithin(daemon, 10_000)).toEqual({ code: 0, signal: null });
    expect(await leaderKey(deployment)).not.toBe("PUT");
  });

  it("a SIGTERM while NATS does not answer the connect ends the daemon at once (nothing to release yet)", async () => {
    const accepted: Socket[] = [];
    let connected!: () => void;
    const connecting = new Promise<void>((resolve) => (connected = resolve));
    const silent = createServer((socket) => {
      accepted.push(socket);
      socket.on("error", () => undefined);
      connected();
    });
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => {
      for (const socket of accepted) socket.destroy();
      return new Promise((resolve) => silent.close(resolve));
    });
    const daemon = spawnDaemon(daemonArgs(`stopconnect${process.pid}`, `nats://127.0.0.1:${(silent.address() as { port: number }).port}`, 20_000));
    daemons.push(daemon);
    await connecting;
    daemon.child.kill("SIGTERM");
    // Not after the connect's 20 s timeout.
    expect(await exitWithin(daemon, 5_000)).toEqual({ code: 0, signal: null });
  });

  it("a SIGTERM during the campaign while NATS then stalls ends the daemon within a bounded wait (at most the lease, here 3 s)", async () => {
    const deployment = `stopstall${process.pid}x${counter++}`;
    const { probed } = await silentMember(deployment);
    const proxy: StallProxy = await startStallProxy(Number(new URL(nats.server.url).port));
    cleanups.push(() => proxy.close());
    const daemon = spawnDaemon(daemonArgs(deployment, proxy.url, 3_000));
    daemons.push(daemon);
    await untilProbed(probed, daemon);
    proxy.stall(); // the stop's key release and drain get no answer
    daemon.child.kill("SIGTERM");
    expect(await exitWithin(daemon, 8_000)).toEqual({ code: 0, signal: null });
  });
});
