import { mkdtemp, rm } from "node:fs/promises";
import { createServer, request, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";

// The attach proxy in-process between a real client and a real upstream: the upstream dies while
// the proxy holds its response (admission closed). The call must fail cleanly — a 502 to the
// caller, and no ticket left to stream after reopen, where it would block the next prepare.
let dir: string;
let upstream: Server;
let proxy: Server;
let kind: ModelKind;
let upstreamResponse: ServerResponse | undefined;

const listen = (server: Server) => new Promise<string>((resolve) => server.listen(0, "127.0.0.1", () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)));

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-lost-"));
  upstreamResponse = undefined;
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => (upstreamResponse = res));
  });
  const upstreamUrl = await listen(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t" });
  (proxy as Server & { url?: string }).url = await listen(proxy);
});

afterEach(async () => {
  proxy.closeAllConnections();
  upstream.closeAllConnections();
  await Promise.all([new Promise((r) => proxy.close(r)), new Promise((r) => upstream.close(r))]);
  await kind.close();
  await rm(dir, { recursive: true, force: true });
});

function post(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}/ng-rollout/lost-1/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] }));
  });
}

describe("attach proxy: the upstream dies while its response is held", () => {
  it("answers 502 after reopen and leaves no ticket streaming", async () => {
    const answer = post((proxy as Server & { url: string }).url);
    await waitUntil(() => upstreamResponse !== undefined, "the upstream to receive the call");
    await kind.closeAdmission();
    upstreamResponse!.writeHead(200, { "content-type": "text/event-stream" });
    upstreamResponse!.write('data: {"choices":[{"delta":{"content":"He"}}]}\n\n');
    await waitUntil(() => kind.readiness().counts.held === 1, "the response start to be held");
    upstreamResponse!.socket!.destroy(); // the inference server crashed mid-hold
    // Answered at once, admission still closed: the caller re-issues the call after the checkpoint.
    const { status, body } = await answer;
    expect(status).toBe(502);
    expect(JSON.parse(body).error.code).toBe("internal_error");
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    await kind.openAdmission();
    expect(kind.readiness().blockers).toEqual([]);
    expect(kind.tickets.size).toBe(0);
    expect(await kind.ledger.rows("lost-1")).toEqual([]);
  });
});

describe("attach proxy: a generation body over the limit", () => {
  it("is refused with payload_too_large (413), answered rather than cut off", async () => {
    const small = createAttachProxy({ upstream: parseUpstream("http://127.0.0.1:9/v1"), kind, controlToken: "t", maxBodyBytes: 1024 });
    const url = await listen(small);
    try {
      const response = await fetch(`${url}/ng-rollout/big-1/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(256 * 1024) }] }),
      });
      expect(response.status).toBe(413);
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe("payload_too_large");
    } finally {
      small.closeAllConnections();
      await new Promise((r) => small.close(r));
    }
  });
});
