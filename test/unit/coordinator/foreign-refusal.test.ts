import { describe, expect, it } from "vitest";
import { decodeControllerReply } from "../../../coordinator/client/reply-decoder.js";
import { systemClock } from "../../../coordinator/engine/clock.js";
import { ParticipantClient } from "../../../coordinator/engine/participant-client.js";
import type { ParticipantTransport } from "../../../coordinator/engine/transport.js";
import { CheckpointError } from "../../../protocol/index.js";

// A newer coordinator or participant may answer with a code this build's catalog lacks (the
// catalog only grows): the refusal keeps its code and detail in the message, as internal_error,
// instead of failing the reply's schema as an "invalid reply".
const foreign = JSON.stringify({ error: { code: "brand_new_code", detail: "what the newer peer said" } });

/** A transport whose every request is answered with `reply`. */
const answering = (reply: string): ParticipantTransport => ({ request: () => Promise.resolve(reply) });

describe("a refusal whose code this build does not know", () => {
  it("from the coordinator: internal_error naming the op, the code and the detail", () => {
    let thrown: unknown;
    try {
      decodeControllerReply("checkpoint", foreign);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(CheckpointError);
    expect(thrown).toMatchObject({ code: "internal_error" });
    expect((thrown as Error).message).toBe(
      "the coordinator refused the checkpoint with code brand_new_code, which this build's error catalog does not know (a newer version's?): what the newer peer said",
    );
    // A known code is the refusal itself, as before.
    expect(() => decodeControllerReply("checkpoint", JSON.stringify({ error: { code: "not_found", detail: "no such id" } }))).toThrow(
      expect.objectContaining({ code: "not_found", message: "no such id" }),
    );
  });

  it("from a participant: its outcome is internal_error naming the participant, the op, the code and the detail", async () => {
    const client = new ParticipantClient({ transport: answering(foreign), deployment: "d", token: "t", clock: systemClock, slackMs: 100 });
    const outcome = await client.call({ kind: "model", instance: "m1" }, "prepare", { checkpoint_id: "c1", deadline_ts: Date.now() / 1000 + 5, epoch: 1 }, Date.now() + 5000);
    expect(outcome).toEqual({
      ok: false,
      participant: { kind: "model", instance: "m1" },
      code: "internal_error",
      detail: "model/m1 refused the prepare with code brand_new_code, which this build's error catalog does not know (a newer version's?): what the newer peer said",
    });
  });

  it("anything else not in the catalog's shape stays an invalid reply", async () => {
    const odd = JSON.stringify({ error: { code: "Not A Code", detail: "x" } });
    expect(() => decodeControllerReply("status", odd)).toThrow(expect.objectContaining({ code: "internal_error", message: expect.stringContaining("invalid status reply") }));
    const client = new ParticipantClient({ transport: answering(odd), deployment: "d", token: "t", clock: systemClock, slackMs: 100 });
    const outcome = await client.call({ kind: "agent", instance: "a1" }, "status", {}, Date.now() + 5000);
    expect(outcome).toMatchObject({ ok: false, code: "internal_error", detail: expect.stringContaining("invalid status reply") });
  });
});
