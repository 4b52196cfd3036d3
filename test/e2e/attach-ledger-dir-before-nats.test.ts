import { spawnSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureBuilt } from "./coordinator-process.js";
import { PROXY_ENTRY, commonArgs } from "./model-processes.js";

/**
 * A ledger directory the proxy can never use is configuration (exit 2), whether or not NATS is up:
 * checked after connecting, it was answered `unreachable`, exit 1, while NATS was down, which a
 * supervisor restarts for ever instead of reporting the bad flag.
 */
let dir: string;
let deadNats: string;

beforeAll(async () => {
  ensureBuilt();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-nonats-"));
  // A port nobody listens on: bound, then released.
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  deadNats = `nats://127.0.0.1:${(probe.address() as { port: number }).port}`;
  await new Promise((resolve) => probe.close(resolve));
}, 60_000);

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

function run(args: string[], env: NodeJS.ProcessEnv = process.env) {
  const result = spawnSync(process.execPath, [PROXY_ENTRY, ...args], { encoding: "utf8", timeout: 10_000, killSignal: "SIGKILL", env });
  return { status: result.status, stderr: result.stderr };
}

describe("attach proxy ledger directory refused before NATS", () => {
  it("a --ledger-dir that cannot be created is exit 2 while NATS is unreachable", () => {
    const ledgerDir = `/proc/gym-ckpt-${process.pid}/ledger`;
    const result = run(commonArgs(deadNats, `nonats${process.pid}`, "proxy", "t0ken", ["--upstream", "http://127.0.0.1:9/v1", "--ledger-dir", ledgerDir]));
    expect(result.status, result.stderr).toBe(2);
    expect(result.stderr).toMatch(new RegExp(`^attach model: invalid_request: --ledger-dir ${ledgerDir} cannot be created \\(ENOENT: `, "m"));
  }, 20_000);

  it("a default ledger directory planted writable by others is exit 2 while NATS is unreachable", async () => {
    const shared = join(dir, "tmp");
    await mkdir(join(shared, `gym-ckpt-ledger-${process.getuid?.() ?? "user"}`), { recursive: true });
    await chmod(join(shared, `gym-ckpt-ledger-${process.getuid?.() ?? "user"}`), 0o777);
    const result = run(commonArgs(deadNats, `nonats${process.pid}`, "proxy", "t0ken", ["--upstream", "http://127.0.0.1:9/v1"]), { ...process.env, TMPDIR: shared });
    expect(result.status, result.stderr).toBe(2);
    expect(result.stderr).toMatch(/^attach model: .*is writable by group or others/m);
  }, 20_000);
});
