import { describe, expect, it } from "vitest";
import { dispatchController } from "../../../coordinator/api/controller-dispatch.js";
import type { CheckpointEngine } from "../../../coordinator/engine/checkpoint-engine.js";

/**
 * Both APIs decode bodies with the same dispatch, "so refusals are identical" (http-api.ts). The
 * HTTP API hands it a string, the NATS API the message's bytes: a blank body (whitespace only)
 * must be `{}` over both, not `{}` over HTTP and "malformed JSON" over NATS.
 */
const engine = { status: async () => ({ ok: true }), list: async () => ({ latest: null, checkpoints: [] }) } as unknown as CheckpointEngine;

describe("dispatchController: a blank body", () => {
  it.each(["status", "list"] as const)("is {} for %s whether it arrives as a string (HTTP) or as bytes (NATS)", async (op) => {
    const overHttp = await dispatchController(engine, op, "  \n");
    expect(await dispatchController(engine, op, new TextEncoder().encode("  \n"))).toEqual(overHttp);
  });

  it("a no-break space or a BOM is not blank: refused as malformed JSON over both", async () => {
    for (const body of ["\u00a0", "\ufeff"]) {
      await expect(dispatchController(engine, "status", body)).rejects.toMatchObject({ code: "invalid_request" });
      await expect(dispatchController(engine, "status", new TextEncoder().encode(body))).rejects.toMatchObject({ code: "invalid_request" });
    }
  });
});
