import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * docs/api.md: every command but `collect` ignores SIGUSR1, whose default action opens the V8
 * inspector on 127.0.0.1:9229 (any local user could then run code in a process holding a token),
 * and a SIGUSR1 meant for a collector often reaches a whole process group or job. `gym-ckpt attach`
 * (and `gym`, `seeds`) run their participant program as a child in that same group: it must ignore
 * it too, not open the inspector while holding the participants' control token.
 */
let nats: NatsFixture;
const programs: ChildProgram[] = [];
const inspector = (l: string) => /Debugger listening|inspector/i.test(l);

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
}, 60_000);

afterAll(async () => {
  await Promise.allSettled(programs.map((p) => p.kill("SIGKILL")));
  await nats?.close();
});

describe("SIGUSR1 to the process group of a command that runs a participant program", () => {
  it("gym-ckpt attach model: the proxy opens no inspector and keeps serving", { timeout: 60_000 }, async () => {
    const lines: string[] = [];
    const args = ["attach", "model", "--upstream", "http://127.0.0.1:9/v1", "--listen", "127.0.0.1:0", "--nats", nats.server.url, "--deployment", `usr1${process.pid}`, "--token", "usr1-token", "--cuts", "off"];
    const cli = await startChildProgram("dist/coordinator/cli/main.js", args, { waitReady: true, group: true, onLine: (line) => void lines.push(line) });
    programs.push(cli);
    const url = String(cli.ready!.url);
    process.kill(-cli.child.pid!, "SIGUSR1"); // as `kill -USR1 -- -<pgid>` or a scheduler's job signal
    // Still serving after it; the inspector, had it opened, prints its line meanwhile.
    expect((await fetch(`${url}/health`)).status).toBe(200);
    await cli.kill("SIGTERM");
    expect(await cli.exited, lines.join("\n")).toEqual({ code: 0, signal: null });
    expect(lines.filter(inspector)).toEqual([]);
  });

  it("gym-ckpt gym: neither the launcher nor its five servers open an inspector", { timeout: 90_000 }, async () => {
    const lines: string[] = [];
    // --verbose: the servers' own output reaches the launcher's stderr, prefixed with their name.
    const args = ["gym", "--nats", nats.server.url, "--deployment", `usr1gym${process.pid}`, "--token", "usr1-token", "--verbose"];
    const cli = await startChildProgram("dist/coordinator/cli/main.js", args, { waitReady: true, readyTimeoutMs: 60_000, group: true, onLine: (line) => void lines.push(line) });
    programs.push(cli);
    const urls = cli.ready!.urls as Record<string, string>;
    process.kill(-cli.child.pid!, "SIGUSR1");
    for (const url of Object.values(urls)) expect((await fetch(`${url}/health`)).status, url).toBe(200);
    await cli.kill("SIGTERM");
    await cli.exited;
    expect(lines.filter(inspector)).toEqual([]);
  });
});
