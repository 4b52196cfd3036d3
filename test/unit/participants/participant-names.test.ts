import type { NatsConnection } from "@nats-io/transport-node";
import { describe, expect, it } from "vitest";
import { ControlEndpoint } from "../../../participants/control-plane/nats-endpoint.js";
import { MembershipAnnouncer } from "../../../participants/control-plane/membership-announcer.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { startParticipant } from "../../../participants/control-plane/start-participant.js";
import { fakeSubscriptions } from "../../support/fake-subscriptions.js";

/**
 * A participant's deployment and instance become NATS subject tokens (its control subjects, the
 * members bucket and key) and its checkpoint directory (`gym/<kind>/<instance>`). The library
 * exports the pieces `startParticipant` wires; each checks the names it is given itself, with a
 * catalog code: a `*` made the endpoint subscribe a wildcard and answer (act on) every other
 * deployment's or instance's control messages of that kind, and an instance with a `/` or `..`
 * moved the participant's directory (ids were documented as validated path components).
 */
const refusal = { name: "CheckpointError", code: "invalid_request" };

describe("participant names", () => {
  it("the control plane refuses an instance that is no safe name", () => {
    for (const instance of ["*", ">", "env0.*", "../other", "a/b", ""]) {
      expect(() => new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance }), instance).toThrow(expect.objectContaining(refusal));
    }
  });

  it("the control endpoint refuses a deployment that is no single subject token, before subscribing anything", () => {
    const plane = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env0" });
    try {
      for (const deployment of ["*", ">", "prod.*", "a.b", ""]) {
        const subscribed: string[] = [];
        const inbox = fakeSubscriptions();
        const nc = { subscribe: (subject: string) => (subscribed.push(subject), inbox.nc.subscribe(subject)) } as unknown as NatsConnection;
        expect(() => new ControlEndpoint(plane, { nc, deployment, token: "tok" }).start(), deployment).toThrow(expect.objectContaining(refusal));
        expect(subscribed, deployment).toEqual([]);
      }
    } finally {
      plane.dispose();
    }
  });

  it("the membership announcer refuses such names too", () => {
    const nc = {} as NatsConnection;
    expect(() => new MembershipAnnouncer(nc, "*", "environment", "env0", "inc-1")).toThrow(expect.objectContaining(refusal));
    expect(() => new MembershipAnnouncer(nc, "prod", "environment", "env0.>", "inc-1")).toThrow(expect.objectContaining(refusal));
  });

  it("startParticipant refuses them with invalid_request (a catalog code), not a bare ZodError", async () => {
    const nc = {} as NatsConnection;
    const adapter = new ScriptableKind("environment");
    await expect(startParticipant({ nc, deployment: "*", instance: "env0", token: "tok", adapter })).rejects.toMatchObject(refusal);
    await expect(startParticipant({ nc, deployment: "prod", instance: "*", token: "tok", adapter })).rejects.toMatchObject(refusal);
  });
});
