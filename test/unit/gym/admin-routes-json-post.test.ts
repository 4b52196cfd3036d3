import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CalculatorServer } from "../../../participants/gym/resources-server/calculator-server.js";
import { createPolicyBackend } from "../../../participants/gym/policy-backend/policy-backend.js";

/**
 * The reference servers' admin routes that change state (hold a policy call or a /verify, reset)
 * are unauthenticated test controls. A GET, or a POST without a JSON body, is a request any web page
 * can make to 127.0.0.1 (a link, an image, a no-cors fetch): it could stall every policy call. They
 * now take only a POST with `content-type: application/json`, which a browser sends cross-site only
 * after a CORS preflight these servers never grant.
 */
describe("reference servers' state-changing admin routes take a JSON POST only", () => {
  it("policy backend: a POST without a JSON body is refused invalid_request and holds nothing", async () => {
    const { app, controls } = await createPolicyBackend({ cutToken: "cut-token" });
    try {
      for (const route of ["/admin/hold", "/admin/gate", "/admin/cut-mode", "/admin/reset", "/admin/release", "/admin/ungate"]) {
        const bare = await app.inject({ method: "POST", url: route });
        expect({ route, status: bare.statusCode, code: bare.json().error?.code }).toEqual({ route, status: 400, code: "invalid_request" });
        const form = await app.inject({ method: "POST", url: route, headers: { "content-type": "text/plain" }, payload: "{}" });
        expect({ route, status: form.statusCode }).toEqual({ route, status: 400 });
      }
      expect([controls.holdAfter, controls.gateAfterChunks]).toEqual([null, null]);
      const hold = await app.inject({ method: "POST", url: "/admin/hold", payload: {} });
      expect(hold.json()).toEqual({ hold_after: 0 });
      expect((await app.inject({ method: "POST", url: "/admin/release", payload: {} })).json()).toEqual({ hold_after: null });
    } finally {
      await app.close();
    }
  });

  it("calculator: /admin/verify/hold and /release are JSON POSTs outside the checkpoint middleware; a GET is not_found", async () => {
    const server = new CalculatorServer();
    const { app } = await createResourcesApp(server);
    server.controls.routes(app);
    const held = () => (server.controls as unknown as { held: unknown }).held !== undefined;
    try {
      const get = await app.inject({ method: "GET", url: "/admin/verify/hold" });
      expect([get.statusCode, get.json().error?.code]).toEqual([404, "not_found"]);
      const bare = await app.inject({ method: "POST", url: "/admin/verify/hold" });
      expect([bare.statusCode, bare.json().error?.code]).toEqual([400, "invalid_request"]);
      expect(held()).toBe(false);
      // No capture key: the checkpoint middleware would answer rollout_id_required.
      expect((await app.inject({ method: "POST", url: "/admin/verify/hold", payload: {} })).json()).toEqual({ held: true });
      expect(held()).toBe(true);
      expect((await app.inject({ method: "POST", url: "/admin/verify/release", payload: {} })).json()).toEqual({ held: false });
      expect(held()).toBe(false);
      expect((await app.inject({ method: "GET", url: "/admin/stats" })).statusCode).toBe(200);
    } finally {
      await app.close();
    }
  });
});
