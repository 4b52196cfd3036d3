import { describe, expect, it } from "vitest";
import { refusalOfSync } from "../../support/refusal.js";
import { z } from "zod";
import { MAX_CONTROL_MESSAGE_BYTES, decodeMessage, decodeRequest, encodeMessage } from "../../../protocol/index.js";


/** A JSON object of exactly `bytes` bytes: {"pad":"xxx…"}. */
const ofBytes = (bytes: number) => ({ pad: "x".repeat(bytes - '{"pad":""}'.length) });
const Pad = z.object({ pad: z.string() }).strict();

describe("the control-message codec's bounds", () => {
  // MAX_CONTROL_MESSAGE_BYTES is the largest message allowed, not the first one refused: a message
  // of exactly that many bytes goes through both ways, one byte more is payload_too_large.
  it("decodes and encodes a message of exactly MAX_CONTROL_MESSAGE_BYTES, and refuses one byte more", () => {
    const exact = ofBytes(MAX_CONTROL_MESSAGE_BYTES);
    const text = JSON.stringify(exact);
    expect(Buffer.byteLength(text)).toBe(MAX_CONTROL_MESSAGE_BYTES);
    expect(encodeMessage(exact)).toBe(text);
    expect(decodeMessage(Pad, text)).toEqual(exact);
    expect(decodeRequest(Pad, Buffer.from(text))).toEqual(exact);
    const over = ofBytes(MAX_CONTROL_MESSAGE_BYTES + 1);
    expect(refusalOfSync(() => encodeMessage(over)).code).toBe("payload_too_large");
    expect(refusalOfSync(() => decodeMessage(Pad, JSON.stringify(over))).code).toBe("payload_too_large");
  });

  // Malformed JSON is refused as such, whatever the schema: it never reaches the schema (or the
  // duplicate-key scan, which trusts the text to be JSON) as `undefined`.
  it("refuses malformed JSON naming it, even where the schema would take any value", () => {
    for (const decode of [decodeMessage, decodeRequest]) {
      const error = refusalOfSync(() => decode(z.unknown(), '{"a":'));
      expect([error.code, error.message]).toEqual(["invalid_request", expect.stringContaining("malformed JSON")]);
    }
  });
});
