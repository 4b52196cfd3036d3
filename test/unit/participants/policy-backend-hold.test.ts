import { describe, expect, it } from "vitest";
import { createPolicyBackend } from "../../../participants/gym/policy-backend/policy-backend.js";
import { waitUntil } from "../../support/wait-until.js";

const MESSAGES = [
  { role: "system", content: "sys" },
  { role: "user", content: "Compute: 17 + 25" },
];

describe("reference policy backend hold", () => {
  it("a hold without `after` holds every call not recorded yet and answers that cut-off", async () => {
    const { app, controls } = await createPolicyBackend({ cutToken: "cut-token" });
    const chat = (key: string) => app.inject({ method: "POST", url: "/v1/chat/completions", headers: { "x-ng-capture-key": key }, payload: { messages: MESSAGES } });
    try {
      expect((await chat("r1")).statusCode).toBe(200);

      // The backend picks the cut-off as it arms the hold, so no call recorded before it can be missed.
      const hold = await app.inject({ method: "POST", url: "/admin/hold", payload: {} });
      expect(hold.statusCode).toBe(200);
      expect(hold.json()).toEqual({ hold_after: 1 });

      let answered = false;
      const pending = chat("r2").then((reply) => {
        answered = true;
        return reply;
      });
      await waitUntil(() => controls.calls.length === 2, "the second call to be recorded");
      // Another request through the same server: the unheld call would have answered by now.
      expect((await app.inject({ method: "GET", url: "/admin/calls" })).statusCode).toBe(200);
      expect(answered).toBe(false);
      expect(controls.calls[1]!.finished).toBe(false);

      expect((await app.inject({ method: "POST", url: "/admin/release", payload: {} })).json()).toEqual({ hold_after: null });
      expect((await pending).statusCode).toBe(200);
      expect(controls.calls[1]!.finished).toBe(true);
    } finally {
      await app.close();
    }
  });
});
