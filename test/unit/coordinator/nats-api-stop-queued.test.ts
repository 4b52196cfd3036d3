import { headers as natsHeaders } from "@nats-io/transport-node";
import { describe, expect, it } from "vitest";
import { NatsControllerApi } from "../../../coordinator/api/nats-api.js";
import type { CheckpointEngine } from "../../../coordinator/engine/checkpoint-engine.js";
import { HEADER_AUTHORIZATION } from "../../../protocol/index.js";
import { fakeSubscriptions } from "../../support/fake-subscriptions.js";

describe("NatsControllerApi.stop()", () => {
  it("runs no request its subscriptions still had queued: stop() no longer waits for it, so it would run under a stopping daemon", async () => {
    const inbox = fakeSubscriptions();
    let statusCalls = 0;
    const engine = { status: async () => void statusCalls++ } as unknown as CheckpointEngine;
    const api = new NatsControllerApi({ nc: inbox.nc, deployment: "unit", token: "controller-token", engine });
    await api.start();
    const auth = natsHeaders();
    auth.set(HEADER_AUTHORIZATION, "Bearer controller-token");
    // Delivered to the subscription, not yet taken from its queue, when the stop begins.
    void inbox.request("status", auth, "{}", "_INBOX.controller.1");
    await api.stop();
    for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
    expect(statusCalls).toBe(0);
  });
});
