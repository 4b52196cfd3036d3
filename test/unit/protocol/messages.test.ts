import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { refusalOfSync } from "../../support/refusal.js";
import {
  decodeRequest,
  CheckpointError,
  CommitRequestSchema,
  ERROR_CATALOG,
  ERROR_CODES,
  MAX_CONTROL_MESSAGE_BYTES,
  MAX_ATTEMPT,
  GUARDED_OPS,
  CONTROL_MESSAGES,
  CONTROLLER_OPS,
  PrepareRequestSchema,
  RestoreRequestSchema,
  StatusReplySchema,
  RetireRequestSchema,
  ForgetRequestSchema,
  canonicalDigest,
  canonicalJson,
  MAX_JSON_DEPTH,
  decodeMessage,
  encodeMessage,
  encodeReply,
  tokensEqual,
  bearerToken,
} from "../../../protocol/index.js";

const base = { checkpoint_id: "c1", deadline_ts: 2_000_000_000, epoch: 1 };


describe("control messages", () => {
  it("accepts a valid prepare and rejects unknown fields", () => {
    expect(PrepareRequestSchema.parse(base)).toEqual(base);
    expect(PrepareRequestSchema.safeParse({ ...base, surprise: true }).success).toBe(false);
  });

  it("lets exactly the guarded ops address one incarnation", () => {
    expect([...GUARDED_OPS].sort()).toEqual(["commit", "prepare", "renew", "resume"]);
    const bodies = { prepare: base, renew: base, resume: base, commit: { ...base, checkpoint_dir: "/data/c1", episode_ids: null } };
    for (const op of GUARDED_OPS) {
      const schema = CONTROL_MESSAGES[op].request;
      expect(schema.safeParse({ ...bodies[op], incarnation: "0123abcd" }).success).toBe(true);
      expect(schema.safeParse(bodies[op]).success).toBe(true);
      expect(schema.safeParse({ ...bodies[op], incarnation: "" }).success).toBe(false);
      expect(schema.safeParse({ ...bodies[op], incarnation: "x".repeat(65) }).success).toBe(false);
    }
    expect(RestoreRequestSchema.safeParse({ ...base, checkpoint_dir: "/data/c1", episode_ids: [], incarnation: "i" }).success).toBe(false);
    expect(RetireRequestSchema.safeParse({ ...base, episode_ids: [{ rollout_id: "r", attempt: 0 }], incarnation: "i" }).success).toBe(false);
    expect(ForgetRequestSchema.safeParse({ ...base, rollout_ids: ["r"], incarnation: "i" }).success).toBe(false);
  });

  it("refuses a restore scope naming one rollout at two attempts, on the wire and at the controller API", () => {
    const twice = [
      { rollout_id: "r", attempt: 0 },
      { rollout_id: "s", attempt: 3 },
      { rollout_id: "r", attempt: 1 },
    ];
    const bodies = [
      { schema: RestoreRequestSchema, body: { ...base, checkpoint_dir: "/data/c1" } },
      { schema: CONTROLLER_OPS.restore.request, body: { checkpoint_id: "c1" } },
    ];
    for (const { schema, body } of bodies) {
      const result = schema.safeParse({ ...body, episode_ids: twice });
      expect(result.success).toBe(false);
      expect(result.error?.issues[0]?.message).toContain("rollout r at attempts 0 and 1");
      // The same attempt twice is one entry; other rollouts are independent.
      const fine = [twice[0], twice[1], { rollout_id: "r", attempt: 0 }];
      expect(schema.safeParse({ ...body, episode_ids: fine }).success).toBe(true);
    }
  });

  it("refuses a commit scope naming one rollout at two attempts at the controller API (commit and checkpoint); null stays everything", () => {
    const twice = [
      { rollout_id: "r", attempt: 0 },
      { rollout_id: "s", attempt: 3 },
      { rollout_id: "r", attempt: 1 },
    ];
    for (const schema of [CONTROLLER_OPS.commit.request, CONTROLLER_OPS.checkpoint.request]) {
      const result = schema.safeParse({ checkpoint_id: "c1", episode_ids: twice });
      expect(result.success).toBe(false);
      expect(result.error?.issues[0]?.message).toContain("rollout r at attempts 0 and 1");
      expect(schema.safeParse({ checkpoint_id: "c1", episode_ids: [twice[0], twice[1], { rollout_id: "r", attempt: 0 }] }).success).toBe(true);
      expect(schema.parse({ checkpoint_id: "c1" })).toMatchObject({ episode_ids: null });
      expect(schema.parse({ checkpoint_id: "c1", episode_ids: null })).toMatchObject({ episode_ids: null });
    }
  });

  it("refuses a restore scope naming attempt MAX_ATTEMPT (no next attempt), on the wire and at the controller API", () => {
    const bodies = [
      { schema: RestoreRequestSchema, body: { ...base, checkpoint_dir: "/data/c1" } },
      { schema: CONTROLLER_OPS.restore.request, body: { checkpoint_id: "c1" } },
    ];
    for (const { schema, body } of bodies) {
      const result = schema.safeParse({ ...body, episode_ids: [{ rollout_id: "r", attempt: MAX_ATTEMPT }] });
      expect(result.success).toBe(false);
      expect(result.error?.issues[0]?.message).toContain(`attempt ${MAX_ATTEMPT}`);
      expect(schema.safeParse({ ...body, episode_ids: [{ rollout_id: "r", attempt: MAX_ATTEMPT - 1 }] }).success).toBe(true);
    }
  });

  it("lets a restore pin the participant's manifest by an optional sha256 of 64 lowercase hex digits", () => {
    const restore = { ...base, checkpoint_dir: "/data/c1", episode_ids: [{ rollout_id: "r", attempt: 0 }] };
    const digest = "0123456789abcdef".repeat(4);
    expect(RestoreRequestSchema.parse({ ...restore, manifest_sha256: digest }).manifest_sha256).toBe(digest);
    // Absent: what coordinators before the field send, still accepted.
    expect(RestoreRequestSchema.parse(restore).manifest_sha256).toBeUndefined();
    for (const bad of [digest.toUpperCase(), digest.slice(1), `${digest}0`, `${digest.slice(1)}g`, "", null, 7]) {
      expect(RestoreRequestSchema.safeParse({ ...restore, manifest_sha256: bad }).success).toBe(false);
    }
    const refused = refusalOfSync(() => decodeMessage(RestoreRequestSchema, JSON.stringify({ ...restore, manifest_sha256: "XYZ" })));
    expect(refused.code).toBe("invalid_request");
    expect(refused.message).toContain("manifest_sha256");
  });

  it("requires absolute, normalized checkpoint directories", () => {
    const commit = { ...base, episode_ids: null };
    expect(CommitRequestSchema.parse({ ...commit, checkpoint_dir: "/data/ckpt/c1" }).stop).toBe(false);
    expect(CommitRequestSchema.safeParse({ ...commit, checkpoint_dir: "relative/dir" }).success).toBe(false);
    expect(CommitRequestSchema.safeParse({ ...commit, checkpoint_dir: "/data/../etc" }).success).toBe(false);
    expect(CommitRequestSchema.safeParse({ ...commit, checkpoint_dir: "" }).success).toBe(false);
  });

  it("decodes into catalog errors: malformed, unknown fields, oversized", () => {
    expect(refusalOfSync(() => decodeMessage(PrepareRequestSchema, "{not json")).code).toBe("invalid_request");
    const unknown = refusalOfSync(() => decodeMessage(PrepareRequestSchema, JSON.stringify({ ...base, x: 1 })));
    expect(unknown.code).toBe("invalid_request");
    expect(unknown.message).toMatch(/x/);
    const big = JSON.stringify({ ...base, pad: "x".repeat(MAX_CONTROL_MESSAGE_BYTES) });
    expect(refusalOfSync(() => decodeMessage(PrepareRequestSchema, big)).code).toBe("payload_too_large");
    expect(refusalOfSync(() => encodeMessage({ pad: "x".repeat(MAX_CONTROL_MESSAGE_BYTES) })).code).toBe("payload_too_large");
    // A reply to an op that already ran says so: reply_too_large, not "nothing changed".
    const tooLarge = refusalOfSync(() => encodeReply({ pad: "x".repeat(MAX_CONTROL_MESSAGE_BYTES) }, "commit"));
    expect([tooLarge.code, tooLarge.message]).toEqual(["reply_too_large", expect.stringContaining("commit succeeded")]);
    expect(encodeReply({ ok: true }, "commit")).toBe('{"ok":true}');
    expect(decodeMessage(PrepareRequestSchema, new TextEncoder().encode(JSON.stringify(base)))).toEqual(base);
  });

  it("refuses bytes that are not UTF-8 instead of storing U+FFFD in their place", () => {
    const latin1 = Buffer.from('{"checkpoint_id":"caf\xe9"}', "latin1");
    for (const decode of [decodeMessage, decodeRequest]) {
      expect(refusalOfSync(() => decode(PrepareRequestSchema, latin1))).toMatchObject({ code: "invalid_request", message: "message is not valid UTF-8" });
    }
    // The same text as UTF-8 gets past the decoding (and is then judged by the schema).
    expect(refusalOfSync(() => decodeRequest(PrepareRequestSchema, Buffer.from('{"checkpoint_id":"café"}'))).message).not.toContain("UTF-8");
  });

  it("keeps docs/errors.md in step with the catalog: code, status, meaning and how to solve", () => {
    const doc = readFileSync(new URL("../../../docs/errors.md", import.meta.url), "utf8");
    const documented = [...doc.matchAll(/^\| `([a-z_]+)` \| (\d{3}) \| (.*) \| (.*) \|$/gm)].map((m) => [m[1], Number(m[2]), m[3], m[4]]);
    expect(documented).toEqual(ERROR_CODES.map((code) => [code, ERROR_CATALOG[code].status, ERROR_CATALOG[code].meaning, ERROR_CATALOG[code].solve]));
  });

  it("recognizes CheckpointError across copies by its global symbol", () => {
    const error = new CheckpointError("stale_epoch", "old");
    expect(error instanceof CheckpointError).toBe(true);
    expect(error.toReply()).toEqual({ error: { code: "stale_epoch", detail: "old" } });
    expect(new Error("plain") instanceof CheckpointError).toBe(false);
  });
});

describe("canonical JSON and tokens", () => {
  it("sorts keys at every depth so digests ignore key order", () => {
    expect(canonicalJson({ b: 1, a: { d: [1, { z: 1, y: 2 }], c: null } })).toBe('{"a":{"c":null,"d":[1,{"y":2,"z":1}]},"b":1}');
    expect(canonicalDigest({ a: 1, b: 2 })).toBe(canonicalDigest({ b: 2, a: 1 }));
    expect(canonicalDigest({ a: 1 })).not.toBe(canonicalDigest({ a: 2 }));
  });

  it("sorts keys by UTF-16 code units (docs/api.md), non-ASCII unescaped, no whitespace", () => {
    // U+1F600 is a surrogate pair (D83D DE00), below U+FF01 in UTF-16, above it by code point (Python's order).
    expect(canonicalJson({ "\uFF01": 1, "\u{1F600}": [2, { b: 1, a: "é" }], a: 3 })).toBe('{"a":3,"\u{1F600}":[2,{"a":"é","b":1}],"\uFF01":1}');
  });

  it("keeps a `__proto__` key as data, at every depth, so it counts in the digest", () => {
    const text = '{"__proto__":{"x":1},"b":[{"__proto__":2}]}';
    expect(canonicalJson(JSON.parse(text))).toBe(text);
    expect(canonicalDigest(JSON.parse('{"__proto__":{"x":1},"b":2}'))).not.toBe(canonicalDigest({ b: 2 }));
    expect(canonicalDigest(JSON.parse('{"__proto__":{"x":1}}'))).not.toBe(canonicalDigest(JSON.parse('{"__proto__":{"x":2}}')));
  });

  it("refuses a value nested deeper than MAX_JSON_DEPTH with invalid_request instead of overflowing the stack", () => {
    const nested = (depth: number, leaf: unknown = 1): unknown => {
      let v = leaf;
      for (let i = 0; i < depth; i++) v = i % 2 ? [v] : { k: v };
      return v;
    };
    expect(canonicalJson(nested(MAX_JSON_DEPTH))).toContain('"k"');
    for (const depth of [MAX_JSON_DEPTH + 1, 20_000]) {
      let thrown: unknown;
      try {
        canonicalDigest(nested(depth));
      } catch (error) {
        thrown = error;
      }
      expect(thrown).toBeInstanceOf(CheckpointError);
      expect((thrown as CheckpointError).code).toBe("invalid_request");
    }
  });

  it("compares bearer tokens exactly", () => {
    expect(tokensEqual("s3cret", "s3cret")).toBe(true);
    expect(tokensEqual("s3cret", "s3cre")).toBe(false);
    expect(tokensEqual("", "s3cret")).toBe(false);
    expect(bearerToken("Bearer abc")).toBe("abc");
    expect(bearerToken("Basic abc")).toBeUndefined();
    expect(bearerToken(undefined)).toBeUndefined();
  });
});

describe("participant extras", () => {
  // A commit reply's extras go into checkpoint.json as they are: nested deeper than its readers take
  // (MAX_GLOBAL_MANIFEST_NESTING), the checkpoint would publish and then be refused by every reader.
  const nested = (levels: number): unknown => {
    let value: unknown = 1;
    for (let i = 0; i < levels; i++) value = [value];
    return value;
  };
  const statusReply = (extras: Record<string, unknown>) => ({
    kind: "model",
    instance: "m0",
    phase: "idle",
    checkpoint_id: null,
    lease_expires_at: null,
    epoch: 0,
    retired_rollouts: 0,
    report: { ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [] },
    protocol_version: 1,
    extras,
  });

  it("are refused nested deeper than any JSON value from outside may be, within it accepted", () => {
    const deep = StatusReplySchema.safeParse(statusReply({ cuts: nested(MAX_JSON_DEPTH + 1) }));
    expect(deep.success).toBe(false);
    expect(deep.error?.issues[0]?.message).toMatch(/nested at most 128 levels/);
    const within = StatusReplySchema.safeParse(statusReply({ cuts: nested(MAX_JSON_DEPTH - 1) }));
    expect(within.error?.issues).toBeUndefined();
  });
});
