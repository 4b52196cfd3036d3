import { describe, expect, it } from "vitest";
import { encodeControllerReply } from "../../../coordinator/api/reply-budget.js";
import { loadConfig } from "../../../coordinator/config/config-loader.js";
import { MAX_RETENTION } from "../../../coordinator/config/coordinator-config.js";
import { CtlListReplySchema, MAX_CHECKPOINT_ID_CHARS, MAX_CONTROL_MESSAGE_BYTES, type CtlReplyOf } from "../../../protocol/index.js";

/**
 * `list` over NATS never leaves out its checkpoints, so a `retention` whose listing passes one NATS
 * message made every list `reply_too_large` (about 9,000 checkpoints with 20-character ids). The
 * config caps it where the listing provably fits: each entry at its largest the schema allows.
 */
describe("retention's cap: a list of that many checkpoints fits one NATS message", () => {
  // The longest JSON each field can take: a 128-character id (ASCII only, no escapes), a number
  // printed at 17 significant digits after six zeros, the most negative safe integers.
  const largestEntry = (n: number) => ({
    checkpoint_id: `c${String(n).padStart(MAX_CHECKPOINT_ID_CHARS - 1, "0")}`,
    published_at: -1.2345678901234567e-6,
    epoch: -Number.MAX_SAFE_INTEGER,
    participants: -Number.MAX_SAFE_INTEGER,
    stop: false,
  });

  it("answers in full (no reply_too_large) at the cap, LATEST protected beside it and a 4096-character latest_error", () => {
    const reply: CtlReplyOf<"list"> = CtlListReplySchema.parse({
      latest: null,
      latest_error: { code: "invalid_checkpoint_state", detail: "\u0001".repeat(4096) },
      // Retention keeps `retention` and never the one LATEST names: one more at most.
      checkpoints: Array.from({ length: MAX_RETENTION + 1 }, (_, n) => largestEntry(n)),
    });
    expect(JSON.stringify(reply.checkpoints[0]).length).toBeGreaterThanOrEqual(260);
    const text = encodeControllerReply("list", reply);
    expect(JSON.parse(text)).toEqual(reply);
    // With room to spare (checkpoints retention could not rename away): as many again would nearly fit.
    const perEntry = Buffer.byteLength(JSON.stringify(reply.checkpoints[0])) + 1;
    expect(Buffer.byteLength(text) + (MAX_RETENTION - 200) * perEntry).toBeLessThan(MAX_CONTROL_MESSAGE_BYTES);
  });

  it("refuses a retention over the cap at start, naming where it was set", () => {
    const env = { GYM_CKPT_TOKEN: "t", GYM_CKPT_CHECKPOINT_ROOT: "/data/ck" };
    expect(loadConfig({ env: { ...env, GYM_CKPT_RETENTION: String(MAX_RETENTION) } }).retention).toBe(MAX_RETENTION);
    for (const retention of [MAX_RETENTION + 1, 9_000]) {
      expect(() => loadConfig({ env: { ...env, GYM_CKPT_RETENTION: String(retention) } })).toThrow(
        expect.objectContaining({ code: "invalid_request", message: expect.stringMatching(/retention[\s\S]*set by:\n {2}retention: GYM_CKPT_RETENTION/) }),
      );
    }
  });
});
