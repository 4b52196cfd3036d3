import { describe, expect, it } from "vitest";
import { MAX_CONTROL_MESSAGE_BYTES } from "../../../protocol/index.js";
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

describe("dispatchController: a key named twice in one object", () => {
  const calls: unknown[] = [];
  const recording = {
    prepare: async (request: unknown) => void calls.push(request),
    publish: async (request: unknown) => void calls.push(request),
  } as unknown as CheckpointEngine;

  it("is refused invalid_request over both APIs, before the op runs (JSON.parse would keep the last one silently)", async () => {
    const bodies = [
      '{"checkpoint_id":"a","checkpoint_id":"b"}',
      // the same key spelled with an escape
      '{"checkpoint_id":"a","\\u0063heckpoint_id":"b"}',
      // inside the controller's own state: one of its values would be dropped unseen
      '{"checkpoint_id":"a","controller_state":{"inline":{"step":1,"x":[{"k":1,"k":2}]}}}',
    ];
    for (const body of bodies) {
      const op = body.includes("controller_state") ? "publish" : "prepare";
      for (const sent of [body, new TextEncoder().encode(body)]) {
        await expect(dispatchController(recording, op, sent)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("twice") });
      }
    }
    expect(calls).toEqual([]);
  });

  it("keeps accepting the same key in different objects, and key-like strings as values", async () => {
    const body = '{"checkpoint_id":"a","controller_state":{"inline":{"checkpoint_id":"checkpoint_id","a":{"a":"a:"},"b":[{"a":1},{"a":2}],"s":"\\"a\\":1"}}}';
    calls.length = 0;
    await dispatchController(recording, "publish", body);
    expect(calls).toHaveLength(1);
  });
});

describe("dispatchController: a blank body over the size limit", () => {
  it("is payload_too_large over both APIs, not {} (a checkpoint op with every field optional would run)", async () => {
    const calls: unknown[] = [];
    const recording = { checkpoint: async (request: unknown) => void calls.push(request) } as unknown as CheckpointEngine;
    // The HTTP API reads up to 1 KiB past the limit (its body limit), a NATS server's max_payload may be larger.
    const blank = " ".repeat(MAX_CONTROL_MESSAGE_BYTES + 100);
    for (const sent of [blank, new TextEncoder().encode(blank)]) {
      await expect(dispatchController(recording, "checkpoint", sent)).rejects.toMatchObject({ code: "payload_too_large" });
    }
    expect(calls).toEqual([]);
  });
});

describe("dispatchController: a number an inline controller state cannot keep", () => {
  it("is refused invalid_request over both APIs, before the op runs: 1e400 parses to Infinity, which checkpoint.json would hold as null", async () => {
    const calls: unknown[] = [];
    const recording = {
      publish: async (request: unknown) => void calls.push(request),
      checkpoint: async (request: unknown) => void calls.push(request),
    } as unknown as CheckpointEngine;
    const bodies: [ "publish" | "checkpoint", string][] = [
      ["publish", '{"checkpoint_id":"a","controller_state":{"inline":1e400}}'],
      ["checkpoint", '{"controller_state":{"inline":{"step":1,"loss":[0.5,-1e999]}}}'],
    ];
    for (const [op, body] of bodies) {
      for (const sent of [body, new TextEncoder().encode(body)]) {
        await expect(dispatchController(recording, op, sent)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("controller_state") });
      }
    }
    expect(calls).toEqual([]);
  });

  it("keeps every finite number and a __proto__ key as data", async () => {
    const calls: { controller_state: unknown }[] = [];
    const recording = { publish: async (request: { controller_state: unknown }) => void calls.push(request) } as unknown as CheckpointEngine;
    await dispatchController(recording, "publish", '{"checkpoint_id":"a","controller_state":{"inline":{"x":1e300,"__proto__":{"y":-0.5}}}}');
    expect(JSON.stringify(calls[0]!.controller_state)).toBe('{"inline":{"x":1e+300,"__proto__":{"y":-0.5}}}');
  });
});

describe("dispatchController: an integer JSON.parse cannot hold exactly", () => {
  it("is refused invalid_request over both APIs, before the op runs: a 64-bit seed would come back from checkpoint.json rounded", async () => {
    const calls: unknown[] = [];
    const recording = { publish: async (request: unknown) => void calls.push(request) } as unknown as CheckpointEngine;
    for (const seed of ["9223372036854775807", "-9007199254740993", "18446744073709551615"]) {
      const body = `{"checkpoint_id":"a","controller_state":{"inline":{"seed":${seed},"note":"9223372036854775807"}}}`;
      for (const sent of [body, new TextEncoder().encode(body)]) {
        await expect(dispatchController(recording, "publish", sent)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining(seed) });
      }
    }
    expect(calls).toEqual([]);
  });

  it("keeps accepting integers a double holds exactly (as JSON.stringify writes 2^60: 1152921504606847000), fractions and exponents (doubles either way), and digits inside strings", async () => {
    const calls: unknown[] = [];
    const recording = { publish: async (request: unknown) => void calls.push(request) } as unknown as CheckpointEngine;
    await dispatchController(recording, "publish", '{"checkpoint_id":"a","controller_state":{"inline":[9007199254740991,-9007199254740992,1152921504606847000,100000000000000000000,0.1,1e300,12345678901234567890.5,"9223372036854775807"]}}');
    expect(calls).toHaveLength(1);
  });
});
