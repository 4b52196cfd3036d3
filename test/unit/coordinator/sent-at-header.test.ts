import type { MsgHdrs } from "@nats-io/transport-node";
import { describe, expect, it } from "vitest";
import { NatsParticipantTransport } from "../../../coordinator/engine/nats-transport.js";
import { ParticipantClient } from "../../../coordinator/engine/participant-client.js";
import type { TransportRequestOptions } from "../../../coordinator/engine/transport.js";
import { HEADER_SENT_AT } from "../../../protocol/index.js";
import { echoNatsConnection } from "../../support/echo-nats-connection.js";
import { TestClock } from "./fake-participants.js";

describe("the coordinator's send time (Gym-Sent-At)", () => {
  it("is stamped on each op by the clock its deadline comes from", async () => {
    const clock = new TestClock(1_800_000_000_000);
    const sent: TransportRequestOptions[] = [];
    const transport = { request: (_subject: string, _body: string, options: TransportRequestOptions) => (sent.push(options), Promise.resolve('{"phase":"idle","idempotent":false}')) };
    const client = new ParticipantClient({ transport, deployment: "d", token: "t", clock, slackMs: 100 });
    await client.call({ kind: "model", instance: "m1" }, "resume", { checkpoint_id: "c1", deadline_ts: clock.now() / 1000 + 5, epoch: 1 }, clock.now() + 5000);
    expect(sent.map((o) => o.sentAtMs)).toEqual([1_800_000_000_000]);
  });

  it("is sent as a header in whole milliseconds, and only when given", async () => {
    const captured: (MsgHdrs | undefined)[] = [];
    const nc = echoNatsConnection((headers) => captured.push(headers));
    const transport = new NatsParticipantTransport(nc);
    await transport.request("s", "{}", { timeoutMs: 100, token: "tok", sentAtMs: 1_800_000_000_123.7 });
    await transport.request("s", "{}", { timeoutMs: 100, token: "tok" }); // the controller client's requests
    expect(captured[0]?.get(HEADER_SENT_AT)).toBe("1800000000123");
    expect(captured[1]?.has(HEADER_SENT_AT)).toBe(false);
  });
});
