import { readFile, writeFile } from "node:fs/promises";
import { connect } from "node:net";
import { join } from "node:path";
import { headers } from "@nats-io/transport-node";
import { Ajv2020 } from "ajv/dist/2020.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { httpUrlOf } from "../../coordinator/api/http-api.js";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import {
  CheckpointError,
  CtlStatusReplySchema,
  ErrorReplySchema,
  HEADER_COORDINATOR_EPOCH,
  HEADER_COORDINATOR_SERVED,
  HEADER_COORDINATOR_ID,
  MAX_ATTEMPT,
  MAX_CHECKPOINT_ID_CHARS,
  MAX_DEADLINE_AHEAD_S,
  controllerSubject,
} from "../../protocol/index.js";
import { journalEntry } from "../unit/coordinator/fake-participants.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";
import { CONTROLLER_TOKEN, DEFAULT_MEMBERS, startWorld, type World } from "./coordinator-harness.js";

let world: World;
let base: string;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  // No failover here, and a few tests do synchronous work in this process (Ajv compiles the OpenAPI
  // document): with the harness's 500 ms lease, a CI-loaded stall of a third of it lost the lease.
  const coordinator = await world.startCoordinator({ lease_ms: 3000 });
  await coordinator.whenReady();
  base = coordinator.httpUrl!;
});
afterAll(async () => {
  await world?.close();
});

const auth = { authorization: `Bearer ${CONTROLLER_TOKEN}` };

async function post(path: string, body: string, headers: Record<string, string> = { ...auth, "content-type": "application/json" }) {
  const response = await fetch(`${base}${path}`, { method: "POST", headers, body });
  return { status: response.status, body: (await response.json()) as Record<string, any> };
}

describe("HTTP controller API (real HTTP client)", () => {
  it("is bound to 127.0.0.1 and serves healthz, readyz and the generated OpenAPI document", async () => {
    expect(new URL(base).hostname).toBe("127.0.0.1");
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    const ready = await fetch(`${base}/readyz`);
    expect(ready.status).toBe(200);
    // The body is as it was before the coordinator was named (older clients read it strictly); the headers name it.
    expect(await ready.json()).toEqual({ ok: true, epoch: expect.any(Number) });
    expect([ready.headers.get(HEADER_COORDINATOR_ID), ready.headers.get(HEADER_COORDINATOR_EPOCH)]).toEqual([expect.stringMatching(/.+/), expect.stringMatching(/^[0-9]+$/)]);
    const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { openapi: string; paths: Record<string, Record<string, any>> };
    expect(doc.openapi).toBe("3.1.0");
    for (const op of ["checkpoint", "prepare", "commit", "publish", "resume", "restore", "retire", "forget"]) expect(doc.paths[`/v1/${op}`]?.post).toBeDefined();
    expect(doc.paths["/v1/status"]?.get).toBeDefined();
    expect(doc.paths["/v1/checkpoints"]?.get).toBeDefined();
    expect(doc.paths["/v1/checkpoints/{checkpoint_id}"]?.get).toBeDefined();
    const prepareBody = doc.paths["/v1/prepare"]!.post.requestBody.content["application/json"].schema;
    expect(prepareBody.additionalProperties).toBe(false);
    expect(prepareBody.required).toEqual(["checkpoint_id"]);
    // A body is required exactly where the request schema has required keys.
    for (const op of ["prepare", "commit", "publish", "resume", "renew", "restore", "retire", "forget"]) expect([op, doc.paths[`/v1/${op}`]!.post.requestBody.required]).toEqual([op, true]);
    expect(doc.paths["/v1/checkpoint"]!.post.requestBody.required).toBe(false);
    // The path parameter is CheckpointIdSchema's, length limit included.
    expect(doc.paths["/v1/checkpoints/{checkpoint_id}"]!.get.parameters[0].schema).toEqual({
      type: "string",
      minLength: 1,
      maxLength: MAX_CHECKPOINT_ID_CHARS,
      pattern: "^[A-Za-z0-9][A-Za-z0-9_-]*(\\.[A-Za-z0-9_-]+)*$",
      // The names the root holds, in any case: LATEST, and what gym-ckpt collect keeps there.
      not: { pattern: "^([Ll][Aa][Tt][Ee][Ss][Tt]|[Rr][Oo][Ll][Ll][Oo][Uu][Tt][Ss]|[Cc][Oo][Ll][Ll][Ee][Cc][Tt][Oo][Rr]\\.[Pp][Ii][Dd]|[Dd][Ii][Ss][Pp][Aa][Tt][Cc][Hh][Ee][Dd]\\.[Jj][Ss][Oo][Nn][Ll])$" },
    });
  });

  it("the served OpenAPI document refuses what the server refuses: LATEST as a checkpoint id, rollout ids ending -a<digits>, a controller state file named checkpoint.json", async () => {
    const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { paths: Record<string, Record<string, any>> };
    const ajv = new Ajv2020({ strict: true, allErrors: true });
    const bodyOf = (op: string) => ajv.compile(doc.paths[`/v1/${op}`]!.post.requestBody.content["application/json"].schema);
    const idParameter = ajv.compile(doc.paths["/v1/checkpoints/{checkpoint_id}"]!.get.parameters[0].schema);
    const refused: [string, Record<string, unknown>][] = [
      ["prepare", { checkpoint_id: "latest" }],
      ["prepare", { checkpoint_id: "LATEST" }],
      ["checkpoint", { checkpoint_id: "Latest" }],
      ["restore", { checkpoint_id: "latest", episode_ids: [] }],
      ["restore", { episode_ids: [{ rollout_id: "r1-a2", attempt: 0 }] }],
      ["retire", { episode_ids: [{ rollout_id: "r1-a10" }] }],
      ["forget", { rollout_ids: ["r1", "r2-a1"] }],
      ["publish", { checkpoint_id: "h1", controller_state: { file: "checkpoint.json" } }],
      ["publish", { checkpoint_id: "h1", controller_state: { file: "CHECKPOINT.json" } }],
    ];
    for (const [op, body] of refused) {
      expect([op, body, bodyOf(op)(body)]).toEqual([op, body, false]);
      expect([op, body, await post(`/v1/${op}`, JSON.stringify(body))]).toMatchObject([op, body, { status: 400, body: { error: { code: "invalid_request" } } }]);
    }
    expect(idParameter("latest")).toBe(false);
    expect((await fetch(`${base}/v1/checkpoints/latest`, { headers: auth })).status).toBe(400);
    // Ids that merely contain the reserved forms stay valid in the document (as for the server).
    expect(bodyOf("prepare")({ checkpoint_id: "latest-1" })).toBe(true);
    expect(idParameter("step-latest")).toBe(true);
    expect(bodyOf("forget")({ rollout_ids: ["r1-a", "r-a1x", "a1"] })).toBe(true);
    expect(bodyOf("restore")({ episode_ids: [{ rollout_id: "r1", attempt: 2 }] })).toBe(true);
  });

  it("the served OpenAPI document states the restore scope's rules and the deadline cap the server enforces", async () => {
    const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { paths: Record<string, Record<string, any>> };
    const ajv = new Ajv2020({ strict: true, allErrors: true });
    const bodySchema = (op: string) => doc.paths[`/v1/${op}`]!.post.requestBody.content["application/json"].schema;
    // An attempt with no next attempt: refused by the document (a `not contains`) as by the server.
    const lastAttempt = { episode_ids: [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: MAX_ATTEMPT }] };
    expect(ajv.compile(bodySchema("restore"))(lastAttempt)).toBe(false);
    expect(await post("/v1/restore", JSON.stringify(lastAttempt))).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(ajv.compile(bodySchema("restore"))({ episode_ids: [{ rollout_id: "r2", attempt: MAX_ATTEMPT - 1 }] })).toBe(true);
    // One attempt per rollout, which JSON Schema cannot state: described, and refused by the server.
    const restoreScope = bodySchema("restore").properties.episode_ids;
    expect(restoreScope.description).toContain("at most one attempt per rollout");
    expect(restoreScope.description).toContain(String(MAX_ATTEMPT));
    const twoAttempts = { episode_ids: [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r1", attempt: 1 }] };
    expect(await post("/v1/restore", JSON.stringify(twoAttempts))).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    // The deadline cap is relative to the coordinator's clock: described on every op that takes one.
    for (const op of ["checkpoint", "prepare", "commit", "resume", "renew", "restore", "retire", "forget"]) {
      const deadline = bodySchema(op).properties.deadline_ts;
      expect([op, deadline?.description]).toEqual([op, expect.stringContaining(`at most ${MAX_DEADLINE_AHEAD_S} s`)]);
    }
    const tooFar = { checkpoint_id: "h-far", deadline_ts: Date.now() / 1000 + MAX_DEADLINE_AHEAD_S + 3600 };
    expect(await post("/v1/prepare", JSON.stringify(tooFar))).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
  });

  it("documents the bodies of /healthz and /readyz and the headers of /readyz, which the replies match (a client compares readyz's epoch)", async () => {
    const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { paths: Record<string, Record<string, any>>; components: { schemas: Record<string, object> } };
    const ajv = new Ajv2020({ strict: true, allErrors: true });
    const schemaOf = (path: string, status: string) => {
      const schema = doc.paths[path]!.get.responses[status]?.content?.["application/json"]?.schema;
      expect([path, status, schema]).toEqual([path, status, expect.any(Object)]);
      const ref = /^#\/components\/schemas\/(.+)$/.exec(schema.$ref ?? "")?.[1];
      return ajv.compile(ref ? doc.components.schemas[ref]! : schema);
    };
    for (const path of ["/healthz", "/readyz"]) {
      const response = await fetch(`${base}${path}`);
      const validate = schemaOf(path, String(response.status));
      expect([path, validate(await response.json()), validate.errors]).toEqual([path, true, null]);
    }
    // The bodies are as before the coordinator was named: a 503 is the bare catalog refusal not_leader
    // (an older HttpControllerClient tells it from a proxy's 503 by that exact shape), a 200 ok and epoch.
    expect(schemaOf("/readyz", "503")({ error: { code: "not_leader", detail: "x" } })).toBe(true);
    expect(schemaOf("/readyz", "503")({ error: { code: "not_leader", detail: "x" }, coordinator_id: "coord-b", epoch: null })).toBe(false);
    expect(schemaOf("/readyz", "200")({ ok: true, epoch: 1 })).toBe(true);
    expect(schemaOf("/readyz", "200")({ ok: true, coordinator_id: "coord-a", epoch: 1 })).toBe(false);
    // Who answered is in headers, documented on both (a client behind a balancer counts only the
    // refusals of the coordinator that took its op), and the ready answer's headers match them.
    const documented = (status: string) => doc.paths["/readyz"]!.get.responses[status].headers as Record<string, { required: boolean; schema: object }>;
    expect(Object.fromEntries(["200", "503"].map((status) => [status, Object.fromEntries(Object.entries(documented(status)).map(([name, header]) => [name, header.required]))]))).toEqual({
      "200": { [HEADER_COORDINATOR_ID]: true, [HEADER_COORDINATOR_EPOCH]: true, [HEADER_COORDINATOR_SERVED]: false },
      "503": { [HEADER_COORDINATOR_ID]: true, [HEADER_COORDINATOR_EPOCH]: false, [HEADER_COORDINATOR_SERVED]: false },
    });
    const ready = await fetch(`${base}/readyz`);
    expect(ready.status).toBe(200);
    for (const [name, header] of Object.entries(documented("200"))) {
      const validate = ajv.compile(header.schema);
      expect([name, validate(ready.headers.get(name)), validate.errors]).toEqual([name, true, null]);
    }
  });

  it("reports a URL clients can use for any host it listens on: an IPv6 literal in brackets (http.host ::1)", async () => {
    expect(httpUrlOf("127.0.0.1", 8480)).toBe("http://127.0.0.1:8480");
    for (const [host, url] of [
      ["::1", "http://[::1]:8480"],
      ["::", "http://[::]:8480"],
    ] as const) {
      expect(httpUrlOf(host, 8480)).toBe(url);
      expect(() => new HttpControllerClient({ baseUrl: url, token: "t" })).not.toThrow();
    }
  });

  it("runs the fine-grained ops one POST each, and GETs status, list and a checkpoint", async () => {
    const prepared = await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h1" }));
    expect(prepared.status).toBe(200);
    expect(prepared.body.prepared).toBe(true);
    const committed = await post("/v1/commit", JSON.stringify({ checkpoint_id: "h1", episode_ids: null }));
    expect(committed.status).toBe(200);
    expect(committed.body.participants).toHaveLength(5);
    const published = await post("/v1/publish", JSON.stringify({ checkpoint_id: "h1", controller_state: { inline: [1, 2, 3] } }));
    expect(published.status).toBe(200);
    const resumed = await post("/v1/resume", JSON.stringify({ checkpoint_id: "h1" }));
    expect(resumed.status).toBe(200);
    expect(resumed.body.participants).toHaveLength(5);
    const status = await fetch(`${base}/v1/status`, { headers: auth });
    expect(status.status).toBe(200);
    const parsed = CtlStatusReplySchema.parse(await status.json());
    expect(parsed.participants.map((p) => p.phase)).toEqual(Array(5).fill("idle"));
    const list = (await (await fetch(`${base}/v1/checkpoints`, { headers: auth })).json()) as { latest: string };
    expect(list.latest).toBe("h1");
    const one = (await (await fetch(`${base}/v1/checkpoints/h1`, { headers: auth })).json()) as { manifest: { controller_state: unknown } };
    expect(one.manifest.controller_state).toEqual({ inline: [1, 2, 3] });
  });

  it("refuses bad input with documented codes and HTTP statuses, changing nothing", async () => {
    expect(await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h2", extra: true }))).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await post("/v1/prepare", JSON.stringify({ checkpoint_id: ["h2"] }))).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await post("/v1/prepare", "{oops")).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h2" }), { "content-type": "application/json" })).toMatchObject({
      status: 401,
      body: { error: { code: "unauthorized" } },
    });
    expect(await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h2" }), { authorization: "Bearer nope", "content-type": "application/json" })).toMatchObject({
      status: 401,
    });
    expect(await post("/v1/commit", JSON.stringify({ checkpoint_id: "unknown" }))).toMatchObject({ status: 404, body: { error: { code: "not_found" } } });
    // h1 was published with another controller state: not a retry
    expect(await post("/v1/publish", JSON.stringify({ checkpoint_id: "h1" }))).toMatchObject({ status: 409, body: { error: { code: "checkpoint_conflict" } } });
    expect(await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h1" }))).toMatchObject({ status: 409, body: { error: { code: "stale_checkpoint" } } });
    expect(await post("/v1/prepare", "x".repeat(1024 * 1024 + 100))).toMatchObject({ status: 413, body: { error: { code: "payload_too_large" } } });
    // A Latin-1 byte in an inline state: refused, not stored as U+FFFD.
    const latin1 = await fetch(`${base}/v1/checkpoint`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: Buffer.from('{"checkpoint_id":"h-latin1","episode_ids":[],"controller_state":{"inline":{"name":"caf\xe9"}}}', "latin1"),
    });
    expect({ status: latin1.status, body: await latin1.json() }).toEqual({ status: 400, body: { error: { code: "invalid_request", detail: "message is not valid UTF-8" } } });
    expect((await fetch(`${base}/v1/checkpoints/h-latin1`, { headers: auth })).status).toBe(404);
    const missing = await fetch(`${base}/v1/checkpoints/nope`, { headers: auth });
    expect(missing.status).toBe(404);
    expect((await fetch(`${base}/v1/nothing`, { method: "POST", headers: auth })).status).toBe(404);
    // A query string is an argument no op reads: refused, as an unknown body field; the op did not run.
    for (const [method, path] of [["GET", "/v1/checkpoints?limit=1"], ["GET", "/v1/status?x"], ["POST", "/v1/prepare?deadline_ts=1"]] as const) {
      const response = await fetch(`${base}${path}`, { method, headers: { ...auth, "content-type": "application/json" }, ...(method === "POST" && { body: JSON.stringify({ checkpoint_id: "h-query" }) }) });
      expect([path, response.status, ((await response.json()) as { error?: { code?: string } }).error?.code]).toEqual([path, 400, "invalid_request"]);
    }
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    // wrong phase: publish before commit
    expect((await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h3" }))).status).toBe(200);
    expect(await post("/v1/publish", JSON.stringify({ checkpoint_id: "h3" }))).toMatchObject({ status: 409, body: { error: { code: "invalid_phase" } } });
    expect(await post("/v1/retire", JSON.stringify({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toMatchObject({ status: 409, body: { error: { code: "invalid_phase" } } });
    expect((await post("/v1/resume", JSON.stringify({ checkpoint_id: "h3" }))).status).toBe(200);
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });

  it("answers framework and HTTP parser errors with catalog refusals, and takes ids of any valid length", async () => {
    // Longer than Fastify's default path-parameter limit (100), within the id schema's.
    const longest = "L".repeat(MAX_CHECKPOINT_ID_CHARS);
    const absent = await fetch(`${base}/v1/checkpoints/${longest}`, { headers: auth });
    expect({ status: absent.status, body: ErrorReplySchema.parse(await absent.json()).error.code }).toEqual({ status: 404, body: "not_found" });
    // No route: named without its query, which may carry a key (`?api_key=…`), as the participants' servers do.
    const unrouted = await fetch(`${base}/v2/status?api_key=s3cret-key`, { headers: auth });
    expect({ status: unrouted.status, error: ErrorReplySchema.parse(await unrouted.json()).error }).toEqual({ status: 404, error: { code: "not_found", detail: "no route GET /v2/status" } });
    for (const path of [`/v1/checkpoints/${longest}x`, "/v1/checkpoints/%E0%A4%A", "/v1/checkpoints/%zz"]) {
      const refused = await fetch(`${base}${path}`, { headers: auth });
      expect({ path, status: refused.status, code: ErrorReplySchema.parse(await refused.json()).error.code }).toEqual({ path, status: 400, code: "invalid_request" });
    }
    // Requests Node's HTTP parser rejects never reach a route: raw sockets, since fetch refuses to send them.
    for (const head of ["POST /v1/prepare HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n", "GET /v1/status HTTP/1.1\r\nHost: x\r\nBad Header\r\n"]) {
      const response = await rawRequest(`${head}\r\n`);
      const [statusLine] = response.split("\r\n");
      expect(statusLine).toBe("HTTP/1.1 400 Bad Request");
      expect(ErrorReplySchema.parse(JSON.parse(response.slice(response.indexOf("\r\n\r\n") + 4))).error.code).toBe("invalid_request");
    }
    // An Expect Node does not know: the catalog refusal, not Node's bare 417.
    const expectation = await rawRequest(`GET /v1/status HTTP/1.1\r\nHost: x\r\nExpect: foo\r\nAuthorization: Bearer ${CONTROLLER_TOKEN}\r\n\r\n`);
    expect(expectation.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request");
    expect(ErrorReplySchema.parse(JSON.parse(expectation.slice(expectation.indexOf("\r\n\r\n") + 4))).error).toMatchObject({ code: "invalid_request", detail: expect.stringContaining("Expect") });
    // No Host (HTTP/1.1): served like any request, not Node's bare 400.
    const hostless = await rawRequest(`GET /v1/checkpoints HTTP/1.1\r\nConnection: close\r\nAuthorization: Bearer ${CONTROLLER_TOKEN}\r\n\r\n`);
    expect(hostless.split("\r\n")[0]).toBe("HTTP/1.1 200 OK");
    expect((await fetch(`${base}/readyz`)).status).toBe(200);
  });

  it("refuses an unauthenticated request before reading its body, answers HEAD on /v1 routes not_found, and documents no reply_too_large for HTTP", async () => {
    // Headers promising 1 MB that never comes: only a refusal sent before the body is read arrives.
    const head = await responseHead("POST /v1/prepare HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n");
    expect(head.split("\r\n")[0]).toBe("HTTP/1.1 401 Unauthorized");
    for (const path of ["/v1/status", "/v1/checkpoints"]) {
      const response = await fetch(`${base}${path}`, { method: "HEAD", headers: auth });
      expect([path, response.status]).toEqual([path, 404]);
    }
    expect((await fetch(`${base}/healthz`, { method: "HEAD" })).status).toBe(200);
    const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { paths: Record<string, Record<string, { responses: Record<string, { description: string }> }>> };
    const refusals = Object.values(doc.paths["/v1/checkpoint"]!.post!.responses).map((r) => r.description).join(", ");
    expect(refusals).toContain("payload_too_large");
    expect(refusals).not.toContain("reply_too_large");
  });

  it("measures a body by its bytes, as the NATS API does: 600 KB that are not UTF-8 are malformed JSON (400), not too large (413)", async () => {
    const bytes = Buffer.alloc(600 * 1024, 0xff);
    const response = await fetch(`${base}/v1/prepare`, { method: "POST", headers: { ...auth, "content-type": "application/json" }, body: bytes });
    expect({ status: response.status, code: ErrorReplySchema.parse(await response.json()).error.code }).toEqual({ status: 400, code: "invalid_request" });
    const h = headers();
    h.set("Authorization", `Bearer ${CONTROLLER_TOKEN}`);
    const overNats = await world.pnc.request(controllerSubject(world.deployment, "prepare"), bytes, { timeout: 5000, headers: h });
    expect(ErrorReplySchema.parse(overNats.json()).error.code).toBe("invalid_request");
  });

  it("the typed HTTP client runs the convenience op and surfaces refusals as CheckpointError", async () => {
    const client = new HttpControllerClient({ baseUrl: base, token: CONTROLLER_TOKEN });
    const reply = await client.checkpoint({ checkpoint_id: "h4" });
    expect(reply.participants).toBe(5);
    expect((await client.get("h4")).latest).toBe(true);
    await expect(client.get("absent")).rejects.toSatisfy((e: unknown) => e instanceof CheckpointError && e.code === "not_found");
    const bad = new HttpControllerClient({ baseUrl: base, token: "wrong" });
    await expect(bad.status()).rejects.toMatchObject({ code: "unauthorized" });
  });

  it("the typed clients refuse an invalid id to get alike, over HTTP (where a URL would resolve `..` away) as over NATS", async () => {
    const http = new HttpControllerClient({ baseUrl: base, token: CONTROLLER_TOKEN });
    for (const id of ["..", ".", "", "a/b", "LATEST"]) {
      const [overHttp, overNats] = await Promise.all([refusalOf(http.get(id)), refusalOf(world.client.get(id))]);
      expect([id, overHttp.code, overHttp.message]).toEqual([id, "invalid_request", overNats.message]);
    }
  });
});

describe("refusals docs/api.md lists per op", () => {
  it("renew: stale_checkpoint for a resumed id, checkpoint_conflict while another is open; get and restore: invalid_checkpoint_state for a corrupt checkpoint.json", async () => {
    expect(await post("/v1/renew", JSON.stringify({ checkpoint_id: "h1" }))).toMatchObject({ status: 409, body: { error: { code: "stale_checkpoint" } } });
    expect((await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h6" }))).status).toBe(200);
    expect(await post("/v1/renew", JSON.stringify({ checkpoint_id: "h7" }))).toMatchObject({ status: 409, body: { error: { code: "checkpoint_conflict" } } });
    expect((await post("/v1/resume", JSON.stringify({ checkpoint_id: "h6" }))).status).toBe(200);

    await new HttpControllerClient({ baseUrl: base, token: CONTROLLER_TOKEN }).checkpoint({ checkpoint_id: "h8" });
    await writeFile(join(world.root, "h8", "checkpoint.json"), "{not json");
    const got = await fetch(`${base}/v1/checkpoints/h8`, { headers: auth });
    expect({ status: got.status, code: ErrorReplySchema.parse(await got.json()).error.code }).toEqual({ status: 422, code: "invalid_checkpoint_state" });
    expect(await post("/v1/restore", JSON.stringify({ checkpoint_id: "h8", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toMatchObject({
      status: 422,
      body: { error: { code: "invalid_checkpoint_state" } },
    });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });
});

/**
 * The daemon marks its lease serving (markServing) only after the NATS API subscribed: a few ms after
 * the HTTP API already answers ops and /readyz 200 (ready and recovered), and never if that subscribe
 * fails or a stop begins in between. /readyz took its Served header from that mark alone, so a refusal
 * from that term in the gap (its renewal lapsed) lacked it: an HTTP client took the term answering its
 * op for one not serving yet and ended the op outcome_unknown. The daemon's beforeNatsApiStart hook
 * holds the gap open (the real daemon, NATS and HTTP otherwise).
 */
describe("/readyz of a term whose lease is not marked serving yet", () => {
  it("says the term served (Gym-Coordinator-Served) once its HTTP API serves ops", async () => {
    const gapWorld = await startWorld({ nats: world.nats });
    let release!: () => void;
    const subscribed = new Promise<void>((resolve) => (release = resolve));
    try {
      const coordinator = await gapWorld.startCoordinator({ lease_ms: 3000 }, { hooks: { beforeNatsApiStart: () => subscribed } });
      const url = coordinator.httpUrl!;
      await waitUntil(async () => (await fetch(`${url}/readyz`)).status === 200, "the HTTP API to answer ready", 15_000);
      expect(coordinator.lease.state()).toMatchObject({ ready: true, serving: false });
      expect((await fetch(`${url}/v1/checkpoints`, { headers: auth })).status).toBe(200);
      const ready = await fetch(`${url}/readyz`);
      expect([ready.status, ready.headers.get(HEADER_COORDINATOR_EPOCH), ready.headers.get(HEADER_COORDINATOR_SERVED)]).toEqual([200, String(coordinator.lease.state().epoch), "1"]);
      release();
      await coordinator.whenReady();
      expect(coordinator.lease.state().serving).toBe(true);
    } finally {
      release();
      await gapWorld.close();
    }
  });
});

describe("list with a damaged LATEST", () => {
  it("answers the listing (latest null, latest_error), which the typed clients and the served OpenAPI document take, not invalid_checkpoint_state", async () => {
    await new HttpControllerClient({ baseUrl: base, token: CONTROLLER_TOKEN }).checkpoint({ checkpoint_id: "h10" });
    const latestFile = join(world.root, "LATEST");
    const before = await readFile(latestFile, "utf8");
    await writeFile(latestFile, "not a checkpoint id!\n");
    try {
      const response = await fetch(`${base}/v1/checkpoints`, { headers: auth });
      const body = (await response.json()) as Record<string, any>;
      expect({ status: response.status, latest: body.latest, latest_error: body.latest_error }).toEqual({
        status: 200,
        latest: null,
        latest_error: { code: "invalid_checkpoint_state", detail: "LATEST does not name a checkpoint id" },
      });
      expect(body.checkpoints.map((c: { checkpoint_id: string }) => c.checkpoint_id)).toContain("h10");
      const doc = (await (await fetch(`${base}/openapi.json`)).json()) as { paths: Record<string, Record<string, any>> };
      const validate = new Ajv2020({ strict: true, allErrors: true }).compile(doc.paths["/v1/checkpoints"]!.get.responses["200"].content["application/json"].schema);
      expect([validate(body), validate.errors]).toEqual([true, null]);
      // The clients decode replies with the strict schema: an unknown field would be an invalid reply.
      const overHttp = await new HttpControllerClient({ baseUrl: base, token: CONTROLLER_TOKEN }).list();
      expect(overHttp).toEqual(body);
      expect(await world.client.list()).toEqual(body);
    } finally {
      await writeFile(latestFile, before);
    }
  });
});

describe("controller state file", () => {
  it("a controller state file named checkpoint.json is refused (invalid_request), not overwritten by the publication", async () => {
    expect((await post("/v1/prepare", JSON.stringify({ checkpoint_id: "h9" }))).status).toBe(200);
    expect((await post("/v1/commit", JSON.stringify({ checkpoint_id: "h9", episode_ids: [] }))).status).toBe(200);
    // A trainer naming its own state file the obvious way.
    const own = join(world.root, "h9", "checkpoint.json");
    await writeFile(own, '{"trainer_step":1200}\n');
    const latestNow = () => readFile(join(world.root, "LATEST"), "utf8").catch(() => null);
    const latest = await latestNow();
    for (const file of ["checkpoint.json", "Checkpoint.JSON"]) {
      expect([file, await post("/v1/publish", JSON.stringify({ checkpoint_id: "h9", controller_state: { file } }))]).toMatchObject([
        file,
        { status: 400, body: { error: { code: "invalid_request" } } },
      ]);
    }
    expect(await readFile(own, "utf8")).toBe('{"trainer_step":1200}\n');
    expect(await latestNow()).toBe(latest);
    const status = CtlStatusReplySchema.parse(await (await fetch(`${base}/v1/status`, { headers: auth })).json());
    expect(status.checkpoint).toMatchObject({ checkpoint_id: "h9", phase: "committed" });
    expect((await post("/v1/resume", JSON.stringify({ checkpoint_id: "h9" }))).status).toBe(200);
  });
});

/** Sends bytes as they are and returns everything the server wrote before it closed the connection. */
function rawRequest(text: string): Promise<string> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(text));
    let received = "";
    socket.on("data", (chunk: Buffer) => (received += chunk.toString()));
    socket.on("error", reject);
    socket.on("close", () => resolve(received));
  });
}

/** Sends bytes as they are and returns the response head (status line and headers) once it arrived; fails after 10 s without one. */
function responseHead(text: string): Promise<string> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(text));
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error("no response within 10 s"));
    }, 10_000);
    let received = "";
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString();
      const end = received.indexOf("\r\n\r\n");
      if (end < 0) return;
      clearTimeout(timer);
      socket.destroy();
      resolve(received.slice(0, end));
    });
    socket.on("error", reject);
  });
}

/**
 * An aborted checkpoint whose checkpoint.json its leader could not take back keeps its journal entry
 * (undecided, `open`); the catalog withholds it only at a leader that knows of it, which a successor
 * does once its recovery read that entry. Before then HTTP `list` and `get` answered from the root
 * alone and served the aborted checkpoint as published (listed, readable by id): they now wait for
 * recovery as every other op does, `not_leader`, the same gate as the NATS API's subscription
 * (docs/api.md §3). The daemon's beforeRecover hook holds the recovery open.
 */
describe("list and get at a coordinator that has not recovered its predecessor's journal", () => {
  it("answer not_leader until recovery took the aborted checkpoint back, then leave it out; status is answered meanwhile", async () => {
    const failoverWorld = await startWorld({ nats: world.nats });
    let release!: () => void;
    const recoveryHeld = new Promise<void>((resolve) => (release = resolve));
    try {
      await failoverWorld.startParticipants();
      const first = await failoverWorld.startCoordinator({ lease_ms: 1500 });
      await first.whenReady();
      await failoverWorld.client.checkpoint({ checkpoint_id: "ok1" });
      await failoverWorld.client.checkpoint({ checkpoint_id: "aborted1" });
      const journal = await KvDecisionJournal.open(failoverWorld.pnc, failoverWorld.deployment);
      // The checkpoint op's entry goes after its reply (once LATEST is durable), while its leader leads.
      await waitUntil(async () => (await journal.list()).length === 0, "the published checkpoints' journal entries to go", 10_000);
      await first.stop();
      // What an aborted publication whose take-back failed leaves: its checkpoint.json, LATEST naming
      // the checkpoint before it, and its journal entry rewritten undecided.
      await writeFile(join(failoverWorld.root, "LATEST"), "ok1\n");
      await journal.record(journalEntry({ checkpoint_id: "aborted1", state: "open", participants: DEFAULT_MEMBERS, epoch: first.lease.state().epoch ?? 1 }));

      const second = await failoverWorld.startCoordinator({ lease_ms: 1500 }, { hooks: { beforeRecover: (_epoch, attempt) => (attempt === 1 ? recoveryHeld : undefined) } });
      const url = second.httpUrl!;
      await waitUntil(() => second.lease.state().ready, "the successor's lease to be ready", 15_000);
      for (const path of ["/v1/checkpoints", "/v1/checkpoints/aborted1", "/v1/checkpoints/ok1"]) {
        const held = await fetch(`${url}${path}`, { headers: auth });
        expect([path, held.status, await held.json()]).toEqual([path, 503, { error: expect.objectContaining({ code: "not_leader" }) }]);
      }
      const status = await fetch(`${url}/v1/status`, { headers: auth });
      expect([status.status, ((await status.json()) as { coordinator: { ready: boolean } }).coordinator.ready]).toEqual([200, false]);

      release();
      await second.whenReady();
      const listed = (await (await fetch(`${url}/v1/checkpoints`, { headers: auth })).json()) as { latest: string; checkpoints: { checkpoint_id: string }[] };
      expect([listed.latest, listed.checkpoints.map((c) => c.checkpoint_id)]).toEqual(["ok1", ["ok1"]]);
      const aborted = await fetch(`${url}/v1/checkpoints/aborted1`, { headers: auth });
      expect([aborted.status, await aborted.json()]).toEqual([404, { error: expect.objectContaining({ code: "not_found" }) }]);

      // A follower has not recovered either: the same refusal, whatever its root holds.
      const follower = await failoverWorld.startCoordinator({ lease_ms: 1500 });
      const fromFollower = await fetch(`${follower.httpUrl!}/v1/checkpoints`, { headers: auth });
      expect([fromFollower.status, await fromFollower.json()]).toEqual([503, { error: expect.objectContaining({ code: "not_leader" }) }]);
    } finally {
      release();
      await failoverWorld.close();
    }
  });
});
