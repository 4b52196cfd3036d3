import { mkdtemp } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";
import { waitUntil } from "../support/wait-until.js";

// The attach proxy between a real client and a real upstream: what happens to a call between its
// admission checks and its dispatch upstream.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
/** Generation calls the upstream received. */
let upstreamCalls: string[];
/** Every admit() the proxy made, so a test can wait for the proxy's next step after it. */
let admissions: Promise<unknown>[];
/** Runs right after an admit() resolved, before the proxy takes its next step. */
let afterAdmit: (() => void) | undefined;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-window-"));
  upstreamCalls = [];
  upstream = createServer((req, res) => {
    upstreamCalls.push(String(req.headers["x-ng-capture-key"]));
    req.resume();
    req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end('{"choices":[]}'));
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  admissions = [];
  afterAdmit = undefined;
  const admit = kind.admit.bind(kind);
  kind.admit = (...args) => {
    const admitted = admit(...args).then((ticket) => {
      afterAdmit?.();
      return ticket;
    });
    admissions.push(admitted);
    return admitted;
  };
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t" });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

/** Sends a generation call for `key`; `abort()` drops the connection. */
function send(key: string): { abort: () => void; done: Promise<unknown> } {
  const req = request(`${proxyUrl}/ng-rollout/${key}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" } });
  const done = new Promise((resolve) => {
    req.on("response", (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode));
    });
    req.on("error", resolve);
  });
  req.end(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }));
  return { abort: () => req.destroy(), done };
}

const proxyConnections = () => new Promise<number>((resolve) => proxy.getConnections((_error, count) => resolve(count)));

describe("attach proxy, a caller gone while its call waits to be admitted", () => {
  it("is not forwarded upstream once admission opens, and leaves no ticket and no row", async () => {
    // The key's ledger read waits (its stripe busy) while a checkpoint closes and reopens admission.
    let releaseStripe: (() => void) | undefined;
    const stripe = kind.ledger.locks.run("w", () => new Promise<void>((resolve) => (releaseStripe = resolve)));
    // Taking the stripe is file work of its own: under load it may not be held yet.
    await waitUntil(() => releaseStripe !== undefined, "the stripe to be held");
    const caller = send("w");
    await waitUntil(async () => (await proxyConnections()) === 1, "the call to reach the proxy");
    await kind.closeAdmission();
    caller.abort();
    await caller.done;
    await waitUntil(async () => (await proxyConnections()) === 0, "the proxy to see the caller leave");
    await kind.openAdmission();
    releaseStripe!();
    await stripe;
    expect(admissions).toHaveLength(1);
    await admissions[0]; // admitted: admission is open again
    // Before, the call was forwarded: its ticket closed only once the upstream's answer met the caller gone.
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    expect(upstreamCalls).toEqual([]);
    expect(await kind.ledger.rows("w")).toEqual([]);
  });
});

describe("attach proxy, an attempt retired after its call was admitted but before it was dispatched", () => {
  it("refuses the call with stale_attempt and sends nothing upstream; the retire does not wait for an upstream answer", async () => {
    let retiring: Promise<void> | undefined;
    afterAdmit = () => {
      retiring = kind.retire([{ rollout_id: "r", attempt: 0 }]); // stops the call's ticket at once
    };
    const response = await fetch(`${proxyUrl}/ng-rollout/r/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
    });
    expect(response.status).toBe(409);
    expect(await response.json()).toMatchObject({ error: { code: "stale_attempt" } });
    await retiring;
    // Before, the call was forwarded and refused only at the upstream's response start.
    expect(upstreamCalls).toEqual([]);
    expect(kind.tickets.size).toBe(0);
  });
});
