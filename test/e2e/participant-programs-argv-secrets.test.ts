import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { NatsServerProcess } from "../../coordinator/local/nats-server-process.js";
import { descendants } from "../support/process-tree.js";
import { ensureBuilt, MAIN } from "./coordinator-process.js";

/**
 * `gym-ckpt attach` and `gym-ckpt gym` run their participant program as a child. A `--nats` URL
 * with a password (or a `--token`) typed on their command line must reach that child, and every
 * process it starts, in the environment only: any local user reads /proc/<pid>/cmdline. nats.js
 * takes no credential from a URL (protocol/nats-connection.ts), but an operator may well put one
 * there. The nats-server listens on a random port, not the default, so a program that gets ready
 * proves the URL still arrived.
 */
const PASSWORD = "argv-SECRET-nats-pass";
const TOKEN = "argv-SECRET-token";
const CUT_TOKEN = "argv-SECRET-cut-token";
let server: NatsServerProcess;
let natsUrl: string;
let root: string;
const programs: ChildProgram[] = [];
// Nothing inherited may carry them: only the flags do.
const env = { GYM_CKPT_NATS_URL: "", GYM_CKPT_NATS_USER: "", GYM_CKPT_NATS_PASS: "", GYM_CKPT_NATS_TOKEN: "", GYM_CKPT_TOKEN: "" };

beforeAll(async () => {
  ensureBuilt();
  server = await NatsServerProcess.start();
  natsUrl = server.url.replace("nats://", `nats://gym:${PASSWORD}@`);
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-argv-secrets-"));
}, 60_000);

afterAll(async () => {
  await Promise.allSettled(programs.map((p) => p.kill("SIGKILL")));
  await server?.dispose();
  if (root) await rm(root, { recursive: true, force: true });
});

/** The command lines of everything `cli` started (its own, which the user typed, excluded). */
function childCommandLines(cli: ChildProgram): string[] {
  return descendants(cli.child.pid!).map((p) => p.cmdline);
}

describe("a NATS URL or token given to a command that runs a participant program", () => {
  it("gym-ckpt attach model: the proxy connects with it, and it is on no child's command line", { timeout: 60_000 }, async () => {
    const lines: string[] = [];
    const args = ["attach", "model", "--upstream", "http://127.0.0.1:9/v1", "--listen", "127.0.0.1:0", "--nats", natsUrl, "--deployment", `argv${process.pid}`, "--token", TOKEN, "--cut-token", CUT_TOKEN, "--cuts", "off"];
    const cli = await startChildProgram(MAIN, args, { waitReady: true, group: true, env: { ...env, TMPDIR: root }, onLine: (line) => void lines.push(line) });
    programs.push(cli);
    const commandLines = childCommandLines(cli);
    expect(commandLines.some((line) => line.includes("participants/attach/main.js")), lines.join("\n")).toBe(true);
    expect(commandLines.filter((line) => line.includes(PASSWORD) || line.includes(TOKEN) || line.includes(CUT_TOKEN))).toEqual([]);
    await cli.kill("SIGTERM");
    expect(await cli.exited, lines.join("\n")).toEqual({ code: 0, signal: null });
  });

  it("gym-ckpt gym: every server connects with it, and it is on no child's command line", { timeout: 120_000 }, async () => {
    const lines: string[] = [];
    const args = ["gym", "--nats", natsUrl, "--deployment", `argvgym${process.pid}`, "--token", TOKEN, "--checkpoint-root", root];
    const cli = await startChildProgram(MAIN, args, { waitReady: true, readyTimeoutMs: 90_000, group: true, env: { ...env, TMPDIR: root }, onLine: (line) => void lines.push(line) });
    programs.push(cli);
    const commandLines = childCommandLines(cli);
    expect(commandLines.length, lines.join("\n")).toBeGreaterThan(5); // gym/main and its servers
    expect(commandLines.filter((line) => line.includes(PASSWORD) || line.includes(TOKEN))).toEqual([]);
    await cli.kill("SIGTERM");
    expect(await cli.exited, lines.join("\n")).toEqual({ code: 0, signal: null });
  });
});
