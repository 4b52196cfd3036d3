import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer as createHttpServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { closedPort } from "../../support/ports.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * A collector's pause before it sends something again (an op answered not_leader, a /run that found
 * no server) is the collection's work, and must keep its process alive: nothing else may. Over
 * --http-url no NATS connection holds the event loop, and a pause whose timer was unref'd let Node
 * exit mid-collection (code 13, an unsettled top-level await) with no summary, no error, and the
 * collector's lock left behind. Run in a process of its own, with a controller that holds no handle.
 */
const root = fileURLToPath(new URL("../../../", import.meta.url));
const child = `
import pino from "pino";
import { CheckpointError } from "${root}protocol/index.js";
import { Collector } from "${root}coordinator/collect/collector.js";
import { idleController } from "${root}test/support/collector-fixture.js";
const [dir, runUrl, refusals] = process.argv.slice(-3);
let left = Number(refusals);
const controller = idleController({
  status: async () => {
    if (left-- > 0) throw new CheckpointError("not_leader", "no coordinator serves status");
    return { checkpoint: null, participants: [] };
  },
});
const collector = new Collector({
  rows: [{ rolloutId: "a", task: {} }],
  runUrl,
  outPath: dir + "/results.jsonl",
  checkpointDir: dir,
  controller,
  runTimeoutSeconds: 60,
  retryPauses: { resendS: 0.2, unreachableS: 0.2 },
  logger: pino({ level: "warn" }, process.stderr),
});
await collector.start();
const summary = await collector.run();
process.stdout.write(JSON.stringify({ finished: summary.finished, failed: summary.failed }) + "\\n");
`;

let dir: string;
let server: Server | undefined;
/** Every collection process started: a test that failed before it exited leaves it running, and its bound dies with the worker. */
const started: ChildProcess[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-pauses-"));
});
afterEach(async () => {
  for (const proc of started.splice(0)) {
    if (proc.exitCode !== null || proc.signalCode !== null) continue;
    const gone = new Promise((resolve) => proc.once("exit", resolve));
    proc.kill("SIGKILL");
    await gone;
  }
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

/** A /run server on `port` that finishes every row at once. */
async function runServer(port: number): Promise<void> {
  server = createHttpServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 })));
  });
  await new Promise<void>((resolve) => server!.listen(port, "127.0.0.1", resolve));
}

/** The collection in its own process; `exited` is bounded, so an old hang fails rather than stalls. */
function collectIn(runUrl: string, statusRefusals: number) {
  const proc = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", child, dir, runUrl, String(statusRefusals)], { stdio: ["ignore", "pipe", "pipe"] });
  started.push(proc);
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
  proc.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const bound = setTimeout(() => proc.kill("SIGKILL"), 30_000);
    proc.once("close", (code) => {
      clearTimeout(bound);
      resolve({ code, stdout, stderr });
    });
  });
  return { exited, stderr: () => stderr };
}

describe("the collector's pauses keep its process alive", () => {
  it("a start-up op answered not_leader is sent again after its pause: the start goes on, the collection finishes", { timeout: 40_000 }, async () => {
    const port = await closedPort();
    await runServer(port);
    const { exited } = collectIn(`http://127.0.0.1:${port}/run`, 1);
    const { code, stdout, stderr } = await exited;
    expect({ code, stdout, stderr: stderr.includes("did not answer for sure") }).toEqual({ code: 0, stdout: '{"finished":1,"failed":0}\n', stderr: true });
  });

  it("a /run that found no server is sent again after its pause, once --run-url accepts connections", { timeout: 40_000 }, async () => {
    const port = await closedPort();
    const collection = collectIn(`http://127.0.0.1:${port}/run`, 0);
    let ended: { code: number | null } | undefined;
    void collection.exited.then((result) => (ended = result));
    await waitUntil(() => collection.stderr().includes("--run-url accepts no connections") || ended !== undefined, "the outage logged", 20_000);
    await runServer(port);
    const { code, stdout } = await collection.exited;
    expect({ code, stdout }).toEqual({ code: 0, stdout: '{"finished":1,"failed":0}\n' });
  });
});
