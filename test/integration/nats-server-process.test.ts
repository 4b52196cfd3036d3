import { spawn } from "node:child_process";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { NatsServerProcess } from "../support/nats.js";
import type { NatsServerExit } from "../../coordinator/local/nats-server-process.js";
import { alive } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/** Pids of live processes whose command line mentions `text`. */
async function processesMentioning(text: string): Promise<number[]> {
  const pids: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    const cmdline = await readFile(`/proc/${entry}/cmdline`, "utf8").catch(() => "");
    const state = await readFile(`/proc/${entry}/stat`, "utf8").catch(() => "");
    if (cmdline.includes(text) && !/^\d+ \(.*\) Z/.test(state)) pids.push(Number(entry));
  }
  return pids;
}

describe("NatsServerProcess", () => {
  let server: NatsServerProcess | undefined;
  afterEach(async () => {
    await server?.dispose();
    server = undefined;
  });

  it("starts on a free loopback port below the ephemeral range, with JetStream", async () => {
    server = await NatsServerProcess.start();
    expect(server.port).toBeGreaterThan(0);
    // Below the ephemeral range: no outgoing connection can take it while the server is down for a restart.
    const low = Number((await readFile("/proc/sys/net/ipv4/ip_local_port_range", "utf8")).trim().split(/\s+/)[0]);
    expect(server.port).toBeLessThan(low);
    const nc = await connect({ servers: server.url });
    const jsm = await jetstreamManager(nc);
    const info = await jsm.getAccountInfo();
    expect(info.limits).toBeDefined();
    await nc.close();
  });

  it("reports an exit nobody asked for, with its signal and log, and stays silent for its own stop, kill and restart", async () => {
    const exits: NatsServerExit[] = [];
    server = await NatsServerProcess.start({ onUnexpectedExit: (exit) => exits.push(exit) });
    await server.kill();
    await server.restart();
    await server.stop();
    await server.restart();
    expect(exits).toEqual([]);
    const pid = server.pid!;
    process.kill(pid, "SIGKILL"); // from outside, as a stray kill would
    await waitUntil(() => exits.length > 0, "the unasked exit to be reported");
    expect(exits).toEqual([{ pid, port: server.port, code: null, signal: "SIGKILL", log: expect.stringContaining("Server is ready") }]);
    expect(server.running).toBe(false);
  });

  it("keeps KV data across kill -9 and restart on the same store and port", async () => {
    server = await NatsServerProcess.start();
    const port = server.port;
    let nc = await connect({ servers: server.url });
    const kv = await new Kvm(nc).create("launcher_test");
    await kv.put("k", "v1");
    await nc.close();

    await server.kill();
    await server.restart();
    expect(server.port).toBe(port);

    nc = await connect({ servers: server.url });
    const again = await new Kvm(nc).open("launcher_test");
    expect((await again.get("k"))?.string()).toBe("v1");
    await nc.close();
  });

  it("kills a server that did not listen in time instead of leaving it running", async () => {
    const storeDir = await mkdtemp(join(tmpdir(), "gym-ckpt-nats-slow-"));
    try {
      // The server's ports file goes elsewhere (the last flag wins), so it never looks listening to
      // the launcher, however fast it starts: a 1 ms budget raced a busy machine's first poll.
      const args = ["--ports_file_dir", join(storeDir, "elsewhere")];
      const starting = NatsServerProcess.start({ storeDir, startTimeoutMs: 300, args });
      void starting.then((server) => server.dispose(), () => undefined); // a start that wrongly succeeds must not leak a server
      await expect(starting).rejects.toThrow(/did not listen within 300 ms/);
      await waitUntil(async () => (await processesMentioning(storeDir)).length === 0, "the unstarted nats-server to be gone", 5000);
    } finally {
      await rm(storeDir, { recursive: true, force: true });
    }
  });
  it("started with the defaults, stops when the process that started it is SIGKILLed (a test worker that crashed)", { timeout: 30_000 }, async () => {
    // The starter prints its server's pid and store, then waits to be killed: a vitest worker that
    // died (OOM, a crash) never runs its teardown, and its servers used to run on for ever.
    const launcher = new URL("../../coordinator/local/nats-server-process.ts", import.meta.url).href;
    const script = `const { NatsServerProcess } = await import(${JSON.stringify(launcher)}); const s = await NatsServerProcess.start(); console.log(JSON.stringify({ pid: s.pid, storeDir: s.storeDir })); setInterval(() => {}, 1000);`;
    const starter = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "inherit"] });
    const exited = new Promise<void>((resolve) => starter.once("exit", () => resolve()));
    let started: { pid: number; storeDir: string } | undefined;
    try {
      started = await new Promise<{ pid: number; storeDir: string }>((resolve, reject) => {
        let out = "";
        starter.stdout!.on("data", (chunk: Buffer) => {
          out += chunk.toString();
          if (out.includes("\n")) resolve(JSON.parse(out.split("\n")[0]!));
        });
        void exited.then(() => reject(new Error(`the starter exited before its server listened: ${out}`)));
      });
      expect(alive(started.pid)).toBe(true);
      starter.kill("SIGKILL");
      await exited;
      await waitUntil(() => !alive(started!.pid), "the nats-server of a SIGKILLed starter to stop", 10_000);
    } finally {
      starter.kill("SIGKILL");
      if (started && alive(started.pid)) process.kill(started.pid, "SIGKILL");
      if (started) await rm(started.storeDir, { recursive: true, force: true });
    }
  });
});
