import { describe, expect, it } from "vitest";
import type { z } from "zod";
import {
  CommitReplySchema,
  CtlCommitReplySchema,
  MAX_JSON_DEPTH,
  ParticipantEntrySchema,
  ParticipantManifestSchema,
  PrepareReportSchema,
  StatusReplySchema,
  decodeMessage,
} from "../../../protocol/index.js";
import { CtlPrepareReportSchema } from "../../../protocol/controller-api.js";

/*
 * The protocol's free-form objects (a prepare report's counts, a kind's extras, a manifest's extra)
 * keep a `__proto__` key as data and check its value as any other key's: zod's record skips the key,
 * so it vanished from checkpoint.json and the kind's restore, its value never checked.
 */

const SHA = "a".repeat(64);
const report = (counts: string) => `{"ready":true,"blockers":[],"blocker_count":0,"counts":${counts},"restarts":[]}`;
const manifest = (extra: string) =>
  `{"schema_version":1,"kind":"model","instance":"m1","checkpoint_id":"c1","records_file":"records-${SHA}.jsonl","records_sha256":"${SHA}","record_count":0,"created_at":1,"extra":${extra}}`;
const entry = (extras: string) =>
  `{"kind":"model","instance":"m1","manifest_path":"gym/model/m1/manifest.json","manifest_sha256":"${SHA}","records_sha256":"${SHA}","record_count":0,"episode_ids":[],"extras":${extras}}`;
const status = (extras: string) =>
  `{"kind":"model","instance":"m1","phase":"idle","checkpoint_id":null,"lease_expires_at":null,"epoch":1,"retired_rollouts":0,"report":${report("{}")},"protocol_version":1,"extras":${extras}}`;
const commit = (extras: string) =>
  `{"phase":"committed","manifest":${manifest("{}")},"manifest_path":"gym/model/m1/manifest.json","manifest_sha256":"${SHA}","episode_ids":[],"extras":${extras}}`;

function nested(depth: number): string {
  let text = "1";
  for (let i = 0; i < depth; i++) text = `{"k":${text}}`;
  return text;
}

const FREE_FORM = '{"a":1,"__proto__":{"x":[1,{"__proto__":2}]},"constructor":{"y":2},"prototype":3}';

describe("a __proto__ key in the protocol's free-form objects", () => {
  const cases: [string, z.ZodType, (inner: string) => string, (parsed: any) => unknown][] = [
    ["a status reply's extras", StatusReplySchema, status, (p) => p.extras],
    ["a commit reply's extras", CommitReplySchema, commit, (p) => p.extras],
    ["a participant manifest's extra", ParticipantManifestSchema, manifest, (p) => p.extra],
    ["a checkpoint.json participant entry's extras", ParticipantEntrySchema, entry, (p) => p.extras],
    ["the controller API's commit reply extras", CtlCommitReplySchema, (inner) => `{"checkpoint_id":"c1","epoch":1,"checkpoint_dir":"/c/c1","participants":[${entry(inner)}]}`, (p) => p.participants[0].extras],
  ];

  it.each(cases)("%s keeps it as data, with constructor and prototype, in the sent order", (_name, schema, wrap, pick) => {
    const text = wrap(FREE_FORM);
    const parsed = decodeMessage(schema, text);
    const extras = pick(parsed) as Record<string, unknown>;
    expect(Object.keys(extras)).toEqual(["a", "__proto__", "constructor", "prototype"]);
    expect(Object.getPrototypeOf(extras)).toBe(Object.prototype);
    expect(JSON.stringify(extras)).toBe(FREE_FORM);
    expect(JSON.stringify(parsed)).toBe(text);
  });

  it("a status or commit reply's extras nested too deep under __proto__ are refused as under any other key", () => {
    // The extras object is the first level: a value MAX_JSON_DEPTH - 1 deep under a key fits.
    expect(() => decodeMessage(StatusReplySchema, status(`{"__proto__":${nested(MAX_JSON_DEPTH - 1)}}`))).not.toThrow();
    const replies: [z.ZodType, (inner: string) => string][] = [
      [StatusReplySchema, status],
      [CommitReplySchema, commit],
    ];
    for (const [schema, make] of replies) {
      for (const key of ["k", "__proto__"]) {
        expect(() => decodeMessage(schema, make(`{"${key}":${nested(MAX_JSON_DEPTH)}}`)), key).toThrow(
          expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("extras") }),
        );
      }
    }
  });

  it("a prepare report's counts keep a __proto__ count and refuse one that is no integer", () => {
    for (const schema of [PrepareReportSchema, CtlPrepareReportSchema]) {
      const parsed = decodeMessage(schema, report('{"parked":2,"__proto__":3}'));
      expect(Object.getOwnPropertyDescriptor(parsed.counts, "__proto__")?.value).toBe(3);
      expect(JSON.stringify(parsed.counts)).toBe('{"parked":2,"__proto__":3}');
      expect(() => decodeMessage(schema, report('{"__proto__":"three"}'))).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("__proto__") }));
    }
  });
});
