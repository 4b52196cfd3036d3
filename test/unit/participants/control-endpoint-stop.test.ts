import type { Msg, NatsConnection } from "@nats-io/transport-node";
import { describe, expect, it } from "vitest";
import { ControlEndpoint } from "../../../participants/control-plane/nats-endpoint.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";

/**
 * nats.js keeps yielding the messages a subscription queued before `unsubscribe()`: a stopped
 * endpoint must not act on them (the process is shutting down, or another process owns the name).
 */
describe("control endpoint stop", () => {
  it("answers nothing a subscription still yields after stop", async () => {
    const responded: string[] = [];
    const handled: string[] = [];
    const queued: { release?: () => void } = {};
    const nc = {
      subscribe: (subject: string) => {
        let unsubscribed = false;
        return {
          unsubscribe: () => {
            unsubscribed = true;
            queued.release?.();
          },
          async *[Symbol.asyncIterator]() {
            if (!subject.endsWith(".status")) return;
            // One message was queued before the unsubscribe; nats.js hands it over afterwards.
            await new Promise<void>((resolve) => (queued.release = resolve));
            expect(unsubscribed).toBe(true);
            yield { subject, reply: "_INBOX.x", data: new TextEncoder().encode("{}"), headers: undefined, respond: (body: string) => void responded.push(body) } as unknown as Msg;
          },
        };
      },
    } as unknown as NatsConnection;
    const plane = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env0", clock: new ManualClock(1_700_000_000_000) });
    const handle = plane.handle.bind(plane);
    plane.handle = ((op: never, request: never, parent?: never) => {
      handled.push(op);
      return handle(op, request, parent);
    }) as typeof plane.handle;
    const endpoint = new ControlEndpoint(plane, { nc, deployment: "d", token: "t0ken-t0ken" });
    endpoint.start();
    await endpoint.stop();
    for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
    expect({ responded, handled }).toEqual({ responded: [], handled: [] });
    plane.dispose();
  });
});
