/** Real processes: a nats-server and the code verifier spawned from dist/, its sandbox children watched through /proc. */
import { execFileSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { commonArgs, spawnServer, type SpawnedServer } from "./model-processes.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { alive, descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

const ENTRY = "dist/participants/verifiers/main.js";
let nats: NatsFixture;
let scratch: string;

beforeAll(async () => {
  nats = await startNats();
  scratch = await mkdtemp(join(tmpdir(), "gym-ckpt-verifier-tmp-"));
});
afterAll(async () => {
  await nats?.close();
  await rm(scratch, { recursive: true, force: true });
});

const verify = (url: string, key: string, body: string, init: RequestInit = {}) =>
  fetch(`${url}/ng-rollout/${key}/verify`, { method: "POST", headers: { "content-type": "application/json" }, body, ...init });

describe("code verifier process", () => {
  it("stopped (SIGTERM) with runs in flight and queued, leaves no sandbox children and nothing on disk behind", async () => {
    const verifier: SpawnedServer = await spawnServer("verifier", ENTRY, commonArgs(nats.server.url, "sbx", "verifier0", "tok", ["--verifier", "code"]), 20_000, { TMPDIR: scratch });
    const seen = new TrackedProcesses();
    const sample = () => {
      for (const p of descendants(verifier.child.pid!)) if (p.cmdline.includes("--max-old-space-size")) seen.add(p.pid);
    };
    try {
      // 60 looping cases per run (a minute each), and more runs than CPUs: some wait for a slot.
      const body = JSON.stringify({ task: { function_name: "f", tests: Array.from({ length: 60 }, () => ({ args: [], expected: 1 })) }, answer: "function f() { for (;;) {} }" });
      const requests = Array.from({ length: 6 }, (_, i) => verify(verifier.url, `r${i}`, body).then((r) => r.status, () => "closed"));
      await waitUntil(() => (sample(), seen.size > 0), "a running sandbox child");
      verifier.child.kill("SIGTERM");
      // Every sandbox child the verifier starts until it exits (a queued run may take a freed slot).
      const sampler = setInterval(sample, 5);
      const exit = await verifier.exited;
      clearInterval(sampler);
      await Promise.all(requests);
      const survivors = [...seen].filter(alive);
      const leftovers = (await readdir(scratch)).filter((name) => name.startsWith("gym-ckpt-sandbox-"));
      expect({ code: exit.code, survivors, leftovers }).toEqual({ code: 0, survivors: [], leftovers: [] });
    } finally {
      killAll(seen);
      await verifier.kill();
    }
  });

  it("short of file descriptors, answers the runs it cannot start and stays up", async () => {
    // Which requests meet EMFILE depends on timing (the unit tests check the crashed answer itself).
    const verifier: SpawnedServer = await spawnServer("verifier", ENTRY, commonArgs(nats.server.url, "sbx", "verifier-fd", "tok", ["--verifier", "code"]));
    const pid = verifier.child.pid!;
    const sandboxes = new TrackedProcesses();
    try {
      // A few descriptors above what the idle server holds: concurrent connections take them, then
      // a child's pipes no longer fit and its spawn fails with EMFILE.
      const base = readdirSync(`/proc/${pid}/fd`).length;
      execFileSync("prlimit", ["--pid", String(pid), `--nofile=${base + 8}:${base + 8}`]);
      const body = JSON.stringify({ task: { function_name: "f", tests: [{ args: [], expected: 1 }] }, answer: "function f() { const t = Date.now(); while (Date.now() - t < 150) {} return 1; }" });
      const replies = await Promise.all(
        Array.from({ length: 12 }, (_, i) =>
          verify(verifier.url, `r${i}`, body, { headers: { "content-type": "application/json", connection: "close" }, signal: AbortSignal.timeout(20_000) }).then(
            async (r) => ((await r.json()) as { status?: string }).status ?? r.status,
            (e: unknown) => `failed: ${String((e as { cause?: { code?: string } }).cause?.code ?? e)}`,
          ),
        ),
      );
      for (const p of descendants(pid)) sandboxes.add(p.pid);
      const health = await fetch(`${verifier.url}/health`, { signal: AbortSignal.timeout(10_000) }).then((r) => r.status, (e: unknown) => `failed: ${String(e)}`);
      const uncaught = verifier.output.filter((line) => /EMFILE|Unhandled 'error' event/.test(line)).slice(0, 2);
      expect({ health, uncaught }, `replies: ${JSON.stringify(replies)}`).toEqual({ health: 200, uncaught: [] });
    } finally {
      killAll(sandboxes);
      await verifier.kill();
    }
  });
});
