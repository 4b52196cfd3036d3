import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { descendants } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * The coordinator benchmark's world (responders in a child process, client connections, a
 * coordinator daemon) stops what it started when a later step fails: a coordinator that cannot
 * start (its checkpoint root cannot be made) used to leave the responders' process running,
 * connected to NATS, after the benchmark had given up.
 */
type Bench = typeof import("../../bench/coordinator-checkpoint.js");

let nats: NatsFixture;
let dir: string;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  dir = await mkdtemp(join(tmpdir(), "bench-world-"));
});
afterAll(async () => {
  await nats?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const responders = () => descendants(process.pid).filter((p) => p.cmdline.includes("coordinator-checkpoint.js"));

it("a coordinator that cannot start leaves no responders behind", async () => {
  const bench = (await import(pathToFileURL(resolve("dist/bench/coordinator-checkpoint.js")).href)) as Bench;
  const file = join(dir, "a-file");
  await writeFile(file, "");
  await expect(bench.startWorld(nats.server.url, join(file, "root"), "benchfail", 4)).rejects.toThrow(/cannot be created/);
  // SIGTERMed, they close their connection and exit.
  await waitUntil(() => responders().length === 0, "the responders' process to exit", 10_000).catch((error: unknown) => {
    const left = responders();
    left.forEach((p) => process.kill(p.pid, "SIGKILL"));
    throw new Error(`${String(error)}: left ${left.map((p) => p.pid).join(", ")}`);
  });
});
