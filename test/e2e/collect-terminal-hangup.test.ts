import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile, readdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { collectArgs } from "../support/collect-args.js";
import { CONTROLLER_TOKEN } from "../support/gym-processes.js";
import { collectHarness } from "./collect-processes.js";

/**
 * `gym-ckpt collect` on a terminal that goes away (its window closed, an ssh session dropped). It
 * runs on a pseudo-terminal made by util-linux `script`, under a small session leader that passes
 * the terminal's hangup on to it as a login shell does to its jobs, and writes down how it ended.
 * Killing `script` closes the terminal: every write to it fails with EIO from then on.
 */
const { setUp } = collectHarness();
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

const SESSION_LEADER = `
const { spawn } = require("node:child_process");
const { writeFileSync } = require("node:fs");
const [status, ...args] = process.argv.slice(2);
const child = spawn(process.execPath, args, { stdio: "inherit" });
process.on("SIGHUP", () => child.kill("SIGHUP"));
child.on("exit", (code, signal) => writeFileSync(status, JSON.stringify({ code, signal })));
`;

const quote = (arg: string) => `'${arg.replaceAll("'", "'\\''")}'`;

let terminal: ChildProcess | undefined;
afterEach(() => {
  terminal?.kill("SIGKILL");
  terminal = undefined;
});

describe("collect: terminal hangup", () => {
  it("stops where it is, writes its records, removes collector.pid and dies by SIGHUP (no EIO crash, its logs included)", { timeout: 60_000 }, async () => {
    const w = await setUp(2);
    await w.backend.hold(2); // r0 finishes (two policy calls), r1 stays in flight
    const leader = join(w.root, "session-leader.cjs");
    const status = join(w.root, "collector-status.json");
    const records = join(w.root, "records");
    await writeFile(leader, SESSION_LEADER);
    const args = collectArgs({ natsUrl: w.nats.server.url, deployment: w.deployment, token: CONTROLLER_TOKEN, root: w.root, runUrl: `${w.gym.urls.environment!}/run` }, [
      // info: the stop logs on the gone terminal too (its records written, among others).
      "--concurrency", "1", "--records-dir", records, "--records-every-s", "600", "--log-level", "info",
    ]);
    const command = `exec ${[process.execPath, leader, status, CLI, ...args].map(quote).join(" ")}`;
    terminal = spawn("script", ["-qfec", command, "/dev/null"], { stdio: ["pipe", "pipe", "pipe"] });
    const screen: string[] = [];
    terminal.stdout!.on("data", (chunk: Buffer) => screen.push(chunk.toString()));
    await w.waitFor(async () => (await w.backend.calls()).length >= 3, "r0 finished and r1 running");
    await w.waitFor(async () => (await readFile(join(w.root, "results.jsonl"), "utf8").catch(() => "")).includes('"r0"'), "r0 in --out");
    terminal.kill("SIGKILL"); // the terminal goes away
    await w.waitFor(() => existsSync(status), "the collector's end");
    expect(JSON.parse(await readFile(status, "utf8")), screen.join("")).toEqual({ code: null, signal: "SIGHUP" });
    expect(existsSync(join(w.root, "collector.pid"))).toBe(false);
    // The stop wrote the buffered record of r0, which --out has (it is never run again).
    const steps = await readdir(join(records, "rollouts")).catch(() => []);
    const files = await Promise.all(steps.map(async (step) => (await readdir(join(records, "rollouts", step))).map((f) => join(records, "rollouts", step, f))));
    const texts = await Promise.all(files.flat().filter((f) => f.endsWith(".jsonl")).map((f) => readFile(f, "utf8")));
    expect(texts.join("").includes('"r0"'), `records: ${files.flat().join(", ")}`).toBe(true);
    await w.backend.release();
  });
});
