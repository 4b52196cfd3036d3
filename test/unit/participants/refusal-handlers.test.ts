import Fastify from "fastify";
import { describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";
import { createPolicyBackend } from "../../../participants/gym/policy-backend/policy-backend.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { installRefusalHandlers } from "../../../participants/http/refusal-handlers.js";

function app() {
  const server = Fastify({ logger: false, bodyLimit: 64 });
  installRefusalHandlers(server, "test server", null);
  server.post("/echo", async (request) => request.body);
  server.get("/refuse", async () => {
    throw new CheckpointError("admission_closed", "a checkpoint is open");
  });
  server.get("/crash", async () => {
    throw new Error("boom");
  });
  return server;
}

describe("participant HTTP refusal handlers", () => {
  it("every failure carries a catalog code and status", async () => {
    const server = app();
    const cases = [
      { request: { method: "GET" as const, url: "/nowhere?x=1" }, status: 404, code: "not_found", detail: "no route GET /nowhere" },
      { request: { method: "GET" as const, url: "/refuse" }, status: 409, code: "admission_closed", detail: "a checkpoint is open" },
      { request: { method: "GET" as const, url: "/crash" }, status: 500, code: "internal_error", detail: "the test server failed" },
      { request: { method: "POST" as const, url: "/echo", payload: "{not json", headers: { "content-type": "application/json" } }, status: 400, code: "invalid_request" },
      { request: { method: "POST" as const, url: "/echo", payload: { pad: "x".repeat(100) } }, status: 413, code: "payload_too_large" },
    ];
    for (const c of cases) {
      const res = await server.inject(c.request);
      expect(res.statusCode, c.request.url).toBe(c.status);
      const body = res.json() as { error: { code: string; detail: string } };
      expect(body.error.code, c.request.url).toBe(c.code);
      if (c.detail) expect(body.error.detail).toContain(c.detail);
    }
    await server.close();
  });

  it("the reference Gym's servers answer a path the router cannot decode with invalid_request, not Fastify's own body", async () => {
    const kind = new EnvironmentKind();
    const environment = createEnvironmentApp({ kind, endpoints: { agentUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9" } });
    const { app: backend } = await createPolicyBackend({ cutToken: "t" });
    for (const server of [environment, backend]) {
      const res = await server.inject({ method: "GET", url: "/%ff%fe" });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ error: { code: "invalid_request", detail: expect.stringContaining("not a valid url component") } });
      await server.close();
    }
  });

  it("the reference policy backend answers an unknown route with not_found", async () => {
    const { app: backend } = await createPolicyBackend({ cutToken: "t" });
    const res = await backend.inject({ method: "POST", url: "/v2/nothing" });
    expect(res.statusCode).toBe(404);
    expect(res.json()).toMatchObject({ error: { code: "not_found" } });
    await backend.close();
  });
});
