import { execFileSync } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer, type Server } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { PROXY_ENTRY, commonArgs, spawnServer, type SpawnedServer } from "../e2e/model-processes.js";

/**
 * The attach proxy in front of an https upstream (TLS is the upstream client's job): with the
 * upstream's CA trusted through NODE_EXTRA_CA_CERTS a streamed call goes through and its ledger row
 * is written; a proxy that does not trust the certificate answers 502 with a documented code and
 * writes no row. The certificate is made for this run by the system's openssl.
 */
const TOKEN = "https-secret";
let nats: NatsFixture;
let root: string;
let upstream: Server;
let upstreamUrl: string;
const proxies: SpawnedServer[] = [];

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-https-"));
  const [key, cert] = [join(root, "key.pem"), join(root, "cert.pem")];
  execFileSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], { stdio: "ignore" });
  upstream = createServer({ key: await readFile(key), cert: await readFile(cert) }, (req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream", "x-ng-staging-key": `stage/${req.headers["x-ng-model-call-id"]}` });
      res.write('data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n');
      res.write('data: {"choices":[{"index":0,"delta":{"content":"lo"}}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n');
      res.end("data: [DONE]\n\n");
    });
  });
  await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
  upstreamUrl = `https://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`;
});

afterAll(async () => {
  await Promise.all(proxies.map((p) => p.kill()));
  upstream?.closeAllConnections();
  await new Promise<void>((resolve) => (upstream ? upstream.close(() => resolve()) : resolve()));
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

async function startProxy(instance: string, env: NodeJS.ProcessEnv): Promise<SpawnedServer> {
  const args = commonArgs(nats.server.url, `https${instance}`, instance, TOKEN, ["--upstream", upstreamUrl, "--cuts", "off", "--ledger-dir", join(root, instance)]);
  const proxy = await spawnServer(instance, PROXY_ENTRY, args, 20_000, env);
  proxies.push(proxy);
  return proxy;
}

const call = (proxy: SpawnedServer, key: string) =>
  fetch(`${proxy.url}/ng-rollout/${key}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] }),
  });

const ledger = async (proxy: SpawnedServer, key: string): Promise<{ usage: unknown }[]> =>
  ((await (await fetch(`${proxy.url}/ng-capture/v1/ledger/${key}`, { headers: { authorization: `Bearer ${TOKEN}` } })).json()) as { records: { usage: unknown }[] }).records;

describe("attach proxy with an https upstream", () => {
  it("streams through when the upstream's certificate is trusted, and records the call", async () => {
    const proxy = await startProxy("trusted", { NODE_EXTRA_CA_CERTS: join(root, "cert.pem") });
    const response = await call(proxy, "tls-r1");
    expect(response.status).toBe(200);
    const text = await response.text();
    expect(text).toContain('"content":"Hel"');
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true);
    const rows = await ledger(proxy, "tls-r1");
    expect(rows).toHaveLength(1);
    expect(rows[0]!.usage).toMatchObject({ prompt_tokens: 5, completion_tokens: 2 });
  });

  it("answers 502 with a documented code when the certificate is not trusted, and records nothing", async () => {
    const proxy = await startProxy("untrusted", { NODE_EXTRA_CA_CERTS: "" });
    const response = await call(proxy, "tls-r2");
    expect(response.status).toBe(502);
    const body = (await response.json()) as { error: { code: string; detail: string } };
    expect(body.error.code).toBe("upstream_failed");
    expect(body.error.detail).toMatch(/certificate/i);
    expect(await ledger(proxy, "tls-r2")).toEqual([]);
  });
});
