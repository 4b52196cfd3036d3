import { Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { register } from "../../../coordinator/cli/commands/status.js";
import { register as registerCheckpointCommand } from "../../../coordinator/cli/commands/checkpoint.js";
import { register as registerCommit } from "../../../coordinator/cli/commands/commit.js";
import { register as registerPublish } from "../../../coordinator/cli/commands/publish.js";
import { register as registerRestore } from "../../../coordinator/cli/commands/restore.js";
import { register as registerRetire } from "../../../coordinator/cli/commands/retire.js";

/**
 * The client commands' connection flags and variables: a deployment the daemon would refuse is bad
 * usage (invalid_request, exit 2) before anything is connected, and empty variables count as unset,
 * as the daemon's config loader treats them (an env file shared by both).
 */
let stderr: string;
const saved = { ...process.env };
beforeEach(() => {
  stderr = "";
  vi.spyOn(process.stdout, "write").mockImplementation(() => true);
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  process.exitCode = undefined;
  for (const name of ["GYM_CKPT_CONTROLLER_TOKEN", "GYM_CKPT_TOKEN", "GYM_CKPT_DEPLOYMENT", "GYM_CKPT_HTTP_URL", "GYM_CKPT_NATS_URL"]) delete process.env[name];
});
afterEach(() => {
  vi.restoreAllMocks();
  process.exitCode = undefined;
  // In place: the process's own env object stays (the next file in this worker inherits it).
  for (const name of Object.keys(process.env)) if (!(name in saved)) delete process.env[name];
  Object.assign(process.env, saved);
});

// Port 1: nobody listens, so a command that gets as far as connecting fails with not_leader.
async function status(...args: string[]): Promise<number> {
  const program = new Command().exitOverride();
  register(program);
  await program.parseAsync(["status", "--nats-url", "nats://127.0.0.1:1", "--leader-wait-ms", "0", ...args], { from: "user" });
  return Number(process.exitCode ?? 0);
}

describe("client commands: --deployment", () => {
  it.each(["a.b", "a b", "*", ">", ""])("refuses --deployment %j as invalid_request (exit 2), as the daemon refuses it", async (deployment) => {
    expect(await status("--token", "t", "--deployment", deployment)).toBe(2);
    expect(stderr).toMatch(/^error invalid_request: .*deployment/);
  });
});

describe("client commands: --http-url", () => {
  it.each(["", "127.0.0.1:8480"])("refuses --http-url %j as invalid_request (exit 2) instead of falling back to NATS", async (url) => {
    expect(await status("--token", "t", "--http-url", url)).toBe(2);
    expect(stderr).toMatch(/^error invalid_request: --http-url must be an http or https URL/);
  });
});

describe("client commands: a refused --http-url is not echoed with its credentials", () => {
  // Without a scheme, `user:pass@host:port` parses as scheme `user:`: refused as not http(s), and the
  // refusal quoted the whole value, password included, into the terminal and whatever keeps stderr.
  it.each([
    ["--http-url", "admin:SECRET-abc123@127.0.0.1:8480"],
    ["--http-url", "ftp://admin:SECRET-abc123@127.0.0.1:8480"],
    ["--http-url", "127.0.0.1:8480/?key=SECRET-abc123"],
  ])("%s %j: invalid_request (exit 2) naming the host, never the secret", async (flag, url) => {
    expect(await status("--token", "t", flag, url)).toBe(2);
    expect(stderr).toMatch(/^error invalid_request: --http-url must be an http or https URL, got /);
    expect(stderr).toContain("127.0.0.1:8480");
    expect(stderr).not.toContain("SECRET-abc123");
  });
});

describe("client commands: empty variables are unset", () => {
  it("GYM_CKPT_CONTROLLER_TOKEN= falls back to GYM_CKPT_TOKEN, like the daemon's controller_token", async () => {
    process.env.GYM_CKPT_CONTROLLER_TOKEN = "";
    process.env.GYM_CKPT_TOKEN = "shared-token";
    await status();
    expect(stderr).not.toMatch(/no controller token/);
    expect(stderr).toMatch(/^error not_leader: cannot reach NATS/);
  });


  it.each(["Infinity", "0x10", "1e3", "-5", ""])("refuses --timeout-s %j as bad usage before connecting (invalid_request, exit 2)", async (value) => {
    const program = new Command().exitOverride();
    const { register: registerCheckpoint } = await import("../../../coordinator/cli/commands/checkpoint.js");
    registerCheckpoint(program);
    await program.parseAsync(["checkpoint", "--token", "t", "--nats-url", "nats://127.0.0.1:1", "--leader-wait-ms", "0", "--timeout-s", value], { from: "user" });
    expect(Number(process.exitCode)).toBe(2);
    expect(stderr).toContain(`error invalid_request: --timeout-s must be a positive number of seconds`);
  });
});

describe("client commands: --leader-wait-ms over --http-url", () => {
  it("asks again while the coordinator answers not_leader (one still becoming leader), as over NATS", async () => {
    const { createServer } = await import("node:http");
    let asked = 0;
    const server = createServer((req, res) => {
      // The client also asks /readyz beside an op (who leads as it is sent): not an op.
      if (req.url === "/readyz") return void res.writeHead(503, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_leader", detail: "not ready" } }));
      asked += 1;
      const ready = asked > 2;
      res.writeHead(ready ? 200 : 503, { "content-type": "application/json" });
      res.end(
        JSON.stringify(
          ready
            ? { deployment: "default", coordinator: { id: "c1", leader: true, ready: true, epoch: 1 }, checkpoint: null, participants: [] }
            : { error: { code: "not_leader", detail: "waits one lease period" } },
        ),
      );
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
      const program = new Command().exitOverride();
      register(program);
      await program.parseAsync(["status", "--token", "t", "--http-url", url, "--leader-wait-ms", "10000"], { from: "user" });
      expect([Number(process.exitCode ?? 0), stderr]).toEqual([0, ""]);
      expect(asked).toBe(3);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

describe("client commands: a controller token that is not visible ASCII", () => {
  // The daemon refuses such a controller_token, so none could authenticate. nats.js refused it as
  // internal_error; fetch sent a trailing \r trimmed (it worked over HTTP only) and failed a control
  // character as outcome_unknown ("retry with the same arguments") although nothing was sent.
  it.each([
    ["a trailing \\r (a CRLF token file)", "ctl-token\r"],
    ["a control character", "ctl\x01token"],
    ["a space", "ctl token"],
    ["a non-ASCII character", "ctl-tökén"],
  ])("%s is invalid_request (exit 2) before anything is sent, over HTTP and NATS, the token never echoed", async (_what, token) => {
    const { createServer } = await import("node:http");
    let asked = 0;
    const server = createServer((_req, res) => {
      asked += 1;
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ deployment: "default", coordinator: { id: "c1", leader: true, ready: true, epoch: 1 }, checkpoint: null, participants: [] }));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    try {
      const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
      const program = new Command().exitOverride();
      register(program);
      await program.parseAsync(["status", "--token", token, "--http-url", url, "--leader-wait-ms", "0"], { from: "user" });
      expect(Number(process.exitCode ?? 0)).toBe(2);
      expect(asked).toBe(0);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
    process.exitCode = undefined;
    process.env.GYM_CKPT_CONTROLLER_TOKEN = token;
    expect(await status()).toBe(2);
    expect(stderr.split("\n").filter(Boolean)).toEqual([
      expect.stringMatching(/^error invalid_request: the controller token \(--token\) must be visible ASCII/),
      expect.stringMatching(/^error invalid_request: the controller token \(GYM_CKPT_CONTROLLER_TOKEN\) must be visible ASCII/),
    ]);
    expect(stderr).not.toContain(token.slice(0, 5));
  });
});

describe("client commands: what they read from the command line is read before connecting", () => {
  // Nobody listens on port 1: a command that connected first reported "cannot reach NATS"
  // (not_leader, exit 1) and never named the bad file or JSON the operator has to fix.
  const missing = "/nonexistent-gym-ckpt-dir/episodes.json";
  const commands = { retire: registerRetire, restore: registerRestore, commit: registerCommit, checkpoint: registerCheckpointCommand, publish: registerPublish };
  const run = async (name: keyof typeof commands, args: string[]) => {
    const program = new Command().exitOverride();
    commands[name](program);
    await program.parseAsync([name, ...args, "--token", "t", "--nats-url", "nats://127.0.0.1:1", "--leader-wait-ms", "0"], { from: "user" });
  };
  it.each([
    ["retire", ["--episodes", `@${missing}`]],
    ["restore", ["--episodes", `@${missing}`]],
    ["commit", ["c1", "--episodes", `@${missing}`]],
    ["checkpoint", ["--episodes", `@${missing}`]],
  ] as const)("%s --episodes @file: a missing file is invalid_request naming it (exit 2)", async (name, args) => {
    await run(name, [...args]);
    expect([Number(process.exitCode), stderr]).toEqual([2, `error invalid_request: episodes file ${missing} does not exist\n`]);
  });

  it.each([["publish", ["c1"]], ["checkpoint", []]] as const)("%s --state-json: JSON that does not parse is invalid_request (exit 2)", async (name, args) => {
    await run(name, [...args, "--state-json", "{"]);
    expect([Number(process.exitCode), stderr]).toEqual([2, "error invalid_request: --state-json is not valid JSON\n"]);
  });
});
