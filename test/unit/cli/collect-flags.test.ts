import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
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
const signals = ["SIGUSR1", "SIGTERM"] as const;
let before: Map<string, Function[]>;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collect-cli-"));
  await writeFile(join(dir, "tasks.jsonl"), '{"id":"a","task":{}}\n');
  stderr = "";
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  vi.spyOn(process.stdout, "write").mockImplementation(() => true);
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

/** One server for the controller's HTTP API (a fresh deployment, nothing open) and the /run route. */
async function serve(): Promise<string> {
  server = createServer((req, res) => {
    res.setHeader("content-type", "application/json");
    if (req.url === "/v1/status") {
      res.end(JSON.stringify({ deployment: "default", coordinator: { id: "c", leader: true, ready: true, epoch: 1 }, checkpoint: null, participants: [] }));
    } else if (req.url === "/run") {
      req.resume();
      req.on("end", () => res.end(JSON.stringify({ reward: 1 })));
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
    expect(await collect("--run-url", "http://127.0.0.1:1/run", flag, value)).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${flag} must be a positive integer`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each([
    ["--metrics-port", "-1", "an integer from 0 to 65535"],
    ["--metrics-port", "http", "an integer from 0 to 65535"],
    ["--leader-wait-ms", "1.5", "an integer ≥ 0"],
    ["--leader-wait-ms", "", "an integer ≥ 0"],
  ])("refuses %s %j (invalid_request, exit 2) before creating anything", async (flag, value, range) => {
    expect(await collect("--run-url", "http://127.0.0.1:1/run", flag, value)).toBe(2);
    expect(stderr).toContain(`error invalid_request: ${flag} must be ${range}, got ${JSON.stringify(value)}`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it("refuses --json, which collect cannot honour (invalid_request, exit 2)", async () => {
    expect(await collect("--run-url", "http://127.0.0.1:1/run", "--json")).toBe(2);
    expect(stderr).toContain("error invalid_request: --json");
  });

  it("talks to the coordinator over HTTP when --http-url is given", async () => {
    const base = await serve();
    expect(await collect("--run-url", `${base}/run`, "--http-url", base, "--nats-url", "nats://127.0.0.1:1")).toBe(0);
    expect([...(await readResults(join(dir, "results.jsonl"))).keys()]).toEqual(["a"]);
  });
});
