import { execFile } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { asAccount, ensureBuilt } from "./coordinator-process.js";

/**
 * The environment server's --replay-config is a flag value. A bad one should be
 * refused like any bad flag (one line naming the catalog code, exit 2), not crash the process with
 * an uncaught ReplayError stack trace and exit 1 (which a supervisor restarts forever).
 */
const ENV_MAIN = fileURLToPath(new URL("../../dist/participants/gym/environment-server/main.js", import.meta.url));
const run = promisify(execFile);
let nats: NatsFixture;
let dir: string;
beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
});
afterAll(() => nats.close());
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-replay-config-"));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

async function start(config: string, prefix: string[] = []): Promise<{ code: number; stderr: string }> {
  const args = [...prefix.slice(1), ENV_MAIN, "--nats", nats.server.url, "--token", "participant-token", "--agent-url", "http://127.0.0.1:9", "--resources-url", "http://127.0.0.1:9", "--replay-config", config];
  try {
    // Behind `prefix` (another account): its command runs node with the arguments.
    if (prefix.length) args.splice(prefix.length - 1, 0, process.execPath);
    await run(prefix[0] ?? process.execPath, args, { timeout: 30_000 });
    return { code: 0, stderr: "" };
  } catch (error) {
    const e = error as { code?: number; stderr?: string };
    return { code: typeof e.code === "number" ? e.code : -1, stderr: e.stderr ?? "" };
  }
}

describe("environment server --replay-config", () => {
  it("refuses an invalid replay config with one invalid_request line and exit 2", async () => {
    const config = join(dir, "replay.json");
    await writeFile(config, JSON.stringify({ records: "r/*.jsonl", source: { id: "reference-gym" }, mode: "recheck", anchor: "tool-call" }));
    const invalid = await start(config);
    expect(invalid.code).toBe(2);
    expect(invalid.stderr).toMatch(/^environment-server: invalid_request: .*anchor applies to mode=continue only\n$/);
  });

  it("refuses a missing replay config file with one invalid_request line and exit 2", async () => {
    const missing = await start(join(dir, "absent.json"));
    expect(missing.code).toBe(2);
    expect(missing.stderr).toMatch(/^environment-server: invalid_request: .*absent\.json/);
    expect(missing.stderr).not.toMatch(/\n\s+at /); // no stack trace
  });

  // Root reads through mode bits: the server runs as another account (setpriv). A config the storage
  // refuses is no bad flag: exit 2 told a supervisor not to restart over an EACCES or a stale mount.
  it.skipIf(process.getuid?.() !== 0)("a replay config file the storage refuses to open (EACCES) is one storage_error line naming it and exit 1", async () => {
    const shared = await mkdtemp("/tmp/gym-ckpt-replay-config-eacces-");
    try {
      await chmod(shared, 0o755);
      const config = join(shared, "replay.json");
      await writeFile(config, JSON.stringify({ records: "r/*.jsonl", source: { id: "reference-gym" }, mode: "recheck" }), { mode: 0o000 });
      const refused = await start(config, asAccount({ uid: 65534, gid: 65534, umask: 0o022 }));
      expect(refused.stderr).toMatch(/^environment-server: storage_error: EACCES[^\n]*replay\.json[^\n]*\n$/);
      expect(refused.code).toBe(1);
    } finally {
      await rm(shared, { recursive: true, force: true });
    }
  });

  // Root reads through mode bits: the server runs as another account (setpriv).
  it.skipIf(process.getuid?.() !== 0)("a record file the storage refuses to open (EACCES) is one storage_error line and exit 1, not a stack trace", async () => {
    const shared = await mkdtemp("/tmp/gym-ckpt-replay-eacces-");
    try {
      await chmod(shared, 0o755);
      await mkdir(join(shared, "r"), { mode: 0o755 });
      await writeFile(join(shared, "r", "train_rollouts_gym.jsonl"), "", { mode: 0o000 });
      const config = join(shared, "replay.json");
      await writeFile(config, JSON.stringify({ records: "r/*.jsonl", source: { id: "reference-gym" }, mode: "recheck" }), { mode: 0o644 });
      const refused = await start(config, asAccount({ uid: 65534, gid: 65534, umask: 0o022 }));
      expect(refused.stderr).toMatch(/^environment-server: storage_error: EACCES[^\n]*train_rollouts_gym\.jsonl[^\n]*\n$/);
      expect(refused.code).toBe(1);
    } finally {
      await rm(shared, { recursive: true, force: true });
    }
  });
});
