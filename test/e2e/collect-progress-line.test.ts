import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { controllerSubject } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { collectArgs } from "../support/collect-args.js";
import { descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * The live progress line of `gym-ckpt collect` on a terminal (stderr on a pty, through script(1))
 * is ended on a signal's exit too, so what the shell prints next does not land on it. The
 * coordinator is a NATS responder with nothing published or open; `/run` never answers.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

let nats: NatsFixture | undefined;
let root: string | undefined;
let runServer: Server | undefined;
/** The collector, killed in teardown only while its pid still names it. */
const collectors = new TrackedProcesses();
/** script(1) around it: a test that failed before it read collector.pid finds the collector under it. */
const terminals = new TrackedProcesses();
afterEach(async () => {
  for (const pid of terminals) if (terminals.isSame(pid)) for (const d of descendants(pid)) collectors.add(d.pid);
  killAll(terminals);
  killAll(collectors);
  terminals.clear();
  collectors.clear();
  runServer?.closeAllConnections();
  runServer?.close();
  await nats?.close();
  if (root) await rm(root, { recursive: true, force: true });
  nats = root = runServer = undefined;
});

const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;

describe("collect: the live progress line on a terminal", () => {
  it.each([
    { signal: "SIGINT" as const, code: 130 },
    { signal: "SIGHUP" as const, code: 129 },
  ])("is ended by a newline when $signal stops the collection", { timeout: 30_000 }, async ({ signal, code }) => {
    nats = await startNats();
    const deployment = "progress-line";
    const replies: Record<string, unknown> = { status: { deployment, coordinator: { id: "fake", leader: true, ready: true, epoch: 1 }, checkpoint: null, participants: [] }, list: { latest: null, checkpoints: [] } };
    for (const [op, reply] of Object.entries(replies)) nats.nc.subscribe(controllerSubject(deployment, op), { callback: (_err, msg) => void msg.respond(JSON.stringify(reply)) });
    await nats.nc.flush();
    runServer = createServer(() => undefined); // every /run stays in flight
    await new Promise<void>((resolve) => runServer!.listen(0, "127.0.0.1", resolve));
    const runUrl = `http://127.0.0.1:${(runServer.address() as { port: number }).port}/run`;
    root = await mkdtemp(join(tmpdir(), "gym-ckpt-e2e-progress-"));
    await writeFile(join(root, "tasks.jsonl"), `${JSON.stringify({ id: "r0", task: {} })}\n`);
    const args = [process.execPath, CLI, ...collectArgs({ natsUrl: nats.server.url, deployment, token: "controller-token", root, runUrl })];
    const child = spawn("script", ["-qefc", args.map(quote).join(" "), "/dev/null"], { stdio: ["pipe", "pipe", "pipe"] });
    terminals.add(child.pid!);
    let text = "";
    child.stdout.on("data", (chunk: Buffer) => (text += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)));
    await waitUntil(() => text.includes("1 in flight"), `the live progress line, got ${JSON.stringify(text)}`);
    const pid = Number((await readFile(join(root, "collector.pid"), "utf8")).split(" ")[0]);
    collectors.add(pid);
    process.kill(pid, signal);
    expect(await exited, JSON.stringify(text)).toBe(code);
    // After the last redraw of the line, a newline ends it (the terminal shows "\n" as "\r\n").
    expect(text.slice(text.lastIndexOf("\r[")), JSON.stringify(text)).toContain("\n");
  });
});
