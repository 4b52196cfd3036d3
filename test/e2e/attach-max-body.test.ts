import { spawnSync } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { ensureBuilt } from "./coordinator-process.js";
import { PROXY_ENTRY, commonArgs, spawnServer, type SpawnedServer } from "./model-processes.js";

/**
 * `gym-ckpt attach model --max-body-mib N`: the largest generation request body the proxy reads.
 * A multimodal conversation (screenshots as base64 in every turn) outgrows the default 32 MiB within
 * a few turns, where the upstream (vLLM, SGLang) reads it: without the flag each such call was
 * refused 413 and the episode could not go on.
 */
const TOKEN = "t0ken";
const DEPLOYMENT = `maxbody${process.pid}`;
let nats: NatsFixture;
let dir: string;
const started: SpawnedServer[] = [];

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-max-body-"));
}, 60_000);
afterAll(async () => {
  for (const server of started) await server.kill();
  await nats?.close();
  await rm(dir, { recursive: true, force: true });
});

async function proxy(instance: string, extra: string[]): Promise<SpawnedServer> {
  // An upstream nobody listens on: a body the proxy reads is forwarded and fails there (502), one it refuses never leaves (413).
  const args = commonArgs(nats.server.url, DEPLOYMENT, instance, TOKEN, ["--upstream", "http://127.0.0.1:9/v1", "--cuts", "off", "--ledger-dir", join(dir, instance), ...extra]);
  const server = await spawnServer(instance, PROXY_ENTRY, args);
  started.push(server);
  return server;
}

/** A 1.5 MiB chat completion body (one long message) to `proxy`; its status and error code. */
async function post(proxyUrl: string, key: string): Promise<{ status: number; code?: string; detail?: string }> {
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(1536 * 1024) }] });
  const response = await fetch(`${proxyUrl}/ng-rollout/${key}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });
  const reply = (await response.json()) as { error?: { code?: string; detail?: string } };
  return { status: response.status, code: reply.error?.code, detail: reply.error?.detail };
}

describe("attach proxy --max-body-mib", () => {
  it("sets the largest generation body read: past it 413 payload_too_large naming the limit, within it forwarded", async () => {
    const small = await proxy("proxy1", ["--max-body-mib", "1"]);
    expect(await post(small.url, "r1")).toMatchObject({ status: 413, code: "payload_too_large", detail: expect.stringContaining(`${1 << 20} bytes`) });
    const large = await proxy("proxy2", ["--max-body-mib", "2"]);
    expect(await post(large.url, "r2")).toMatchObject({ status: 502, code: "upstream_failed" });
  }, 60_000);

  it.each(["0", "1.5", "257", "lots"])("refuses --max-body-mib %j with exit 2 before connecting", (value) => {
    const result = spawnSync(process.execPath, [PROXY_ENTRY, ...commonArgs("nats://127.0.0.1:1", DEPLOYMENT, "proxy3", TOKEN, ["--upstream", "http://127.0.0.1:9/v1", "--max-body-mib", value])], {
      encoding: "utf8",
      timeout: 10_000,
      killSignal: "SIGKILL",
    });
    expect(result.status, result.stderr).toBe(2);
    expect(result.stderr).toContain("attach model: --max-body-mib must be an integer in 1..256");
  }, 20_000);
});
