import { mkdtemp } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";
import { ledgerRow } from "../unit/model/model-fixtures.js";

// `POST /ng-capture/v1/ledger/retire` removes ledgers: its body is decoded as a control message is.
// JSON.parse keeps the last of a key named twice, so `"attempt":0,"attempt":2` retired 0..2: it is
// refused invalid_request, and nothing is removed.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-retire-body-"));
  upstream = createServer((req, res) => {
    req.resume();
    res.end("{}");
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(upstreamUrl), kind, controlToken: "t" });
  proxyUrl = await listenLocal(proxy);
  for (const key of ["r", "r-a1", "r-a2"]) await kind.ledger.append(ledgerRow(key, `mc-${key}`));
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

async function retire(body: string): Promise<{ status: number; body: unknown }> {
  const response = await fetch(`${proxyUrl}/ng-capture/v1/ledger/retire`, { method: "POST", headers: { authorization: "Bearer t", "content-type": "application/json" }, body });
  return { status: response.status, body: await response.json() };
}

async function keys(): Promise<string[]> {
  return (await kind.ledger.keysOfRollout("r")).map((k) => k.key).sort();
}

it("refuses a retire body naming a key twice and removes nothing", async () => {
  expect(await keys()).toEqual(["r", "r-a1", "r-a2"]);
  const reply = await retire('{"rollout_id":"r","attempt":0,"attempt":2}');
  expect(reply).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
  expect(await keys()).toEqual(["r", "r-a1", "r-a2"]);
});

it("still retires attempts 0..attempt for a well-formed body", async () => {
  const reply = await retire('{"rollout_id":"r","attempt":1}');
  expect(reply.status).toBe(200);
  expect(await keys()).toEqual(["r-a2"]);
});
