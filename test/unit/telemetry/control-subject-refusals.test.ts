import { headers as natsHeaders } from "@nats-io/transport-node";
import { fakeSubscriptions } from "../../support/fake-subscriptions.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ControlEndpoint } from "../../../participants/control-plane/nats-endpoint.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { useTelemetryProviders } from "../../../participants/telemetry/instruments.js";
import { HEADER_AUTHORIZATION } from "../../../protocol/index.js";

/**
 * docs/telemetry.md: `gym_ckpt.refusals` counts "refusals by catalog code a participant answered: on
 * its control subjects and on its data-plane HTTP routes". The control endpoint's own refusals (a
 * wrong bearer token, a malformed message) are answered on the control subjects too.
 */
const { meterProvider, collect } = inMemoryMetrics();
beforeAll(() => useTelemetryProviders({ meterProvider }));
afterAll(async () => {
  useTelemetryProviders({});
  await meterProvider.shutdown();
});


describe("gym_ckpt.refusals on the control subjects", () => {
  it("counts the endpoint's own refusals: a wrong bearer token (unauthorized) and a malformed message (invalid_request)", async () => {
    const plane = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env-r" });
    const inbox = fakeSubscriptions();
    const endpoint = new ControlEndpoint(plane as never, { nc: inbox.nc, deployment: "unit", token: "right-token" });
    endpoint.start();
    try {
      const wrong = natsHeaders();
      wrong.set(HEADER_AUTHORIZATION, "Bearer wrong-token");
      const body = JSON.stringify({ checkpoint_id: "c-r", deadline_ts: Date.now() / 1000 + 30, epoch: 1 });
      expect(JSON.parse(await inbox.request("prepare", wrong, body))).toMatchObject({ error: { code: "unauthorized" } });
      const right = natsHeaders();
      right.set(HEADER_AUTHORIZATION, "Bearer right-token");
      expect(JSON.parse(await inbox.request("prepare", right, "{not json"))).toMatchObject({ error: { code: "invalid_request" } });
    } finally {
      await endpoint.stop();
      plane.dispose();
    }
    const refusals = (await collect()).find((m) => m.descriptor.name === "gym_ckpt.refusals");
    const points = (refusals?.dataPoints ?? []).map((p) => ({ ...p.attributes, value: p.value }));
    expect(points).toEqual(
      expect.arrayContaining([
        { code: "unauthorized", kind: "environment", value: 1 },
        { code: "invalid_request", kind: "environment", value: 1 },
      ]),
    );
  });
});
