import { mkdtemp } from "node:fs/promises";
import { createServer, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";
import { closeAttachFixture, listenLocal, postStreamedChat } from "../support/attach-proxy-fixture.js";

// The attach proxy in-process between a real client and a real upstream: the upstream dies while
// the proxy holds its response (admission closed). The call must fail cleanly — a 502 to the
// caller, and no ticket left to stream after reopen, where it would block the next prepare.
let dir: string;
let upstream: Server;
let proxy: Server;
let kind: ModelKind;
let upstreamResponse: ServerResponse | undefined;


beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-lost-"));
  upstreamResponse = undefined;
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => (upstreamResponse = res));
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t" });
  (proxy as Server & { url?: string }).url = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

describe("attach proxy: the upstream dies while its response is held", () => {
  it("answers 502 after reopen and leaves no ticket streaming", async () => {
    const answer = postStreamedChat((proxy as Server & { url: string }).url, "lost-1");
    await waitUntil(() => upstreamResponse !== undefined, "the upstream to receive the call");
    await kind.closeAdmission();
    upstreamResponse!.writeHead(200, { "content-type": "text/event-stream" });
    upstreamResponse!.write('data: {"choices":[{"delta":{"content":"He"}}]}\n\n');
    await waitUntil(() => kind.readiness().counts.held === 1, "the response start to be held");
    upstreamResponse!.socket!.destroy(); // the inference server crashed mid-hold
    // Answered at once, admission still closed: the caller re-issues the call after the checkpoint.
    const { status, body } = await answer;
    expect(status).toBe(502);
    expect(JSON.parse(body).error.code).toBe("upstream_failed");
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
    const url = await listenLocal(small);
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
