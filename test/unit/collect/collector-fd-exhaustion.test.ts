import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { collectorIn, idleController } from "../../support/collector-fixture.js";

/**
 * A /run that fails because this process is out of file descriptors (EMFILE at connect: the
 * socket could not be made) was never sent: like a refused connection, it is sent again without
 * spending one of --max-attempts. Node's fetch is stubbed to fail so (what it throws then was
 * measured under `ulimit -n`); the /run server is real.
 */
let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-fd-exhaustion-"));
});
afterEach(async () => {
  vi.unstubAllGlobals();
  server?.closeAllConnections();
  server?.close();
  await rm(dir, { recursive: true, force: true });
});

describe("collector out of file descriptors", () => {
  it.each(["EMFILE", "ENFILE"])("a /run failing %s at connect is sent again, not a failed attempt (--max-attempts 1)", async (code) => {
    let sent = 0;
    server = createServer((req, res) => {
      req.resume().on("end", () => {
        sent++;
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 }));
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const realFetch = globalThis.fetch;
    let failures = 2;
    vi.stubGlobal("fetch", (input: Parameters<typeof fetch>[0], init?: RequestInit) =>
      failures-- > 0
        ? Promise.reject(Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error(`connect ${code} 127.0.0.1`), { code, syscall: "connect" }) }))
        : realFetch(input, init),
    );
    const lines: { msg: string; code?: string }[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg: string; code?: string }) });
    const collector = collectorIn(dir, url, idleController(), { logger, maxAttempts: 1, retryPauses: { unreachableS: 0.05 } });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    expect(sent).toBe(1);
    // Said as what it is: this process, not the Gym.
    const said = lines.find((l) => l.code === code);
    expect(said?.msg).toMatch(/file descriptor/);
    // And so is its end: this collector had no descriptor, the Gym was not down.
    const ended = lines.find((l) => l.msg.startsWith("--run-url accepts connections again"));
    expect(ended).toMatchObject({ code });
    expect(ended?.msg).toMatch(/file descriptor/);
  });

  // Each connection made during a shortage woke every waiting row, and with the descriptors still
  // taken nearly all of them failed EMFILE again: about as many failed connects per connection made
  // as rows waited. Now each connection made, and each reply (its socket is free again), wakes at most two.
  it("while descriptors stay short, a connection made wakes at most two waiting rows, not all of them", { timeout: 30_000 }, async () => {
    server = createServer((req, res) => req.resume().on("end", () => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 }))));
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const realFetch = globalThis.fetch;
    // One descriptor to connect with, held until the /run's reply: every other connect meanwhile fails EMFILE.
    let free = 1;
    let connected = 0;
    let failedAfterFirst = 0;
    vi.stubGlobal("fetch", async (input: Parameters<typeof fetch>[0], init?: RequestInit) => {
      if (free === 0) {
        if (connected > 0) failedAfterFirst++;
        throw Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error("connect EMFILE 127.0.0.1"), { code: "EMFILE", syscall: "connect" }) });
      }
      free--;
      connected++;
      try {
        const reply = await realFetch(input, init);
        return new Response(await reply.text(), { status: reply.status, headers: reply.headers });
      } finally {
        free++;
      }
    });
    const rows = Array.from({ length: 40 }, (_, i) => ({ rolloutId: `r${i}`, task: {} }));
    const collector = collectorIn(dir, url, idleController(), { rows, concurrency: 40, maxAttempts: 1, retryPauses: { unreachableS: 0.01, unreachableMaxS: 0.02 } });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 40, failed: 0 });
    expect(connected).toBe(40);
    // Two wakes of at most two per /run (its connection, its reply). Before: each woke every row
    // still waiting (39, 38, …), several hundred failed connects.
    expect(failedAfterFirst).toBeLessThanOrEqual(2 * 2 * connected);
  });

  it("an outage that began at the Gym (ECONNREFUSED) and then ran out of descriptors here says so when that happens, and at its end", async () => {
    server = createServer((req, res) => req.resume().on("end", () => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 }))));
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const realFetch = globalThis.fetch;
    const codes = ["ECONNREFUSED", "EMFILE"];
    vi.stubGlobal("fetch", (input: Parameters<typeof fetch>[0], init?: RequestInit) => {
      const code = codes.shift();
      return code ? Promise.reject(Object.assign(new TypeError("fetch failed"), { cause: Object.assign(new Error(`connect ${code} 127.0.0.1`), { code, syscall: "connect" }) })) : realFetch(input, init);
    });
    const lines: { msg: string; code?: string; level: number }[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg: string; code?: string; level: number }) });
    const collector = collectorIn(dir, url, idleController(), { logger, maxAttempts: 1, retryPauses: { unreachableS: 0.05 } });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
    const outage = lines.filter((l) => l.code !== undefined && /--run-url/.test(l.msg));
    expect(outage.map((l) => [l.level, l.code])).toEqual([
      [40, "ECONNREFUSED"],
      [40, "EMFILE"],
      [30, "EMFILE"],
    ]);
    expect(outage[1]!.msg).toMatch(/file descriptor/);
  });
});
