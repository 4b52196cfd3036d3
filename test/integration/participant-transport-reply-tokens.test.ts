import { afterAll, beforeAll, expect, it } from "vitest";
import { NatsParticipantTransport } from "../../coordinator/engine/nats-transport.js";
import { RequestTimeoutFailure } from "../../coordinator/engine/transport.js";
import { NATS_OP_REPLY_PREFIX } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";

// Participants may publish under the coordinator's op-reply prefix (their answers), and each sees
// the reply subject of the op it is sent. A reply subject another's could be derived from (a
// counter) would let one compromised Gym server answer a concurrent op sent to another participant
// ("prepared", "committed") in its place; each reply subject must be unguessable from the others.

let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

it("a participant that knows its own op's reply subject cannot answer another participant's op", async () => {
  const transport = new NatsParticipantTransport(nats.nc, NATS_OP_REPLY_PREFIX);
  const attacker = await nats.connect();
  const forged: string[] = [];
  // The compromised participant answers its own op honestly, then answers on every subject a
  // counter-based token near its own would give, hoping to hit the other participant's op.
  attacker.subscribe("test.p.evil", {
    callback: (_error, msg) => {
      msg.respond("honest");
      const [prefix, token] = [msg.reply!.slice(0, msg.reply!.lastIndexOf(".")), msg.reply!.slice(msg.reply!.lastIndexOf(".") + 1)];
      const seq = Number.parseInt(token, 36);
      for (let step = -3; step <= 3; step++) {
        if (step === 0 || !Number.isFinite(seq)) continue;
        const subject = `${prefix}.${(seq + step).toString(36)}`;
        forged.push(subject);
        attacker.publish(subject, "forged: prepared");
      }
    },
  });
  // The other participant is slow: it never answers within the op's timeout.
  const victim = await nats.connect();
  victim.subscribe("test.p.victim", { callback: () => undefined });
  await attacker.flush();
  await victim.flush();

  const other = transport.request("test.p.victim", "prepare", { timeoutMs: 1500, token: "t" });
  const own = await transport.request("test.p.evil", "prepare", { timeoutMs: 1500, token: "t" });
  expect(own).toBe("honest");
  await attacker.flush();
  // Only the op's own participant may answer it: unanswered, it is an unknown outcome, never "forged".
  await expect(other).rejects.toBeInstanceOf(RequestTimeoutFailure);
  await attacker.close();
  await victim.close();
});
