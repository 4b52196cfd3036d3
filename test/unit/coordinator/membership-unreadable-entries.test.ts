import type { KV, KvEntry } from "@nats-io/kv";
import { describe, expect, it } from "vitest";
import { readEntry } from "../../../coordinator/membership/member-registry.js";
import { WatchedMemberRegistry } from "../../../coordinator/membership/watched-member-registry.js";
import { MEMBER_TTL_MS, participantOfMemberKey } from "../../../protocol/index.js";
import { TestClock } from "./fake-participants.js";

interface RegistryInternals {
  apply(entry: KvEntry, now: number): void;
}

let revision = 0;
/** A KV entry as the watch delivers it: `value` is what a client put (a string is sent as is). */
function entry(key: string, value: unknown, operation: KvEntry["operation"] = "PUT"): KvEntry {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return {
    key,
    revision: ++revision,
    operation,
    created: new Date(),
    json: () => JSON.parse(text) as unknown,
    string: () => text,
  } as unknown as KvEntry;
}

const v1 = (kind: string, instance: string, extra: Record<string, unknown> = {}) => ({ kind, instance, incarnation: "i1", started_at: 1, heartbeat_at: 1, protocol_version: 1, ...extra });

function registry(clock = new TestClock()) {
  const watched = new WatchedMemberRegistry({} as KV, undefined, clock);
  return { watched, apply: (e: KvEntry) => (watched as unknown as RegistryInternals).apply(e, clock.monotonic()), clock };
}

describe("membership entries this build cannot read", () => {
  // Before: memberOf skipped them (logging membership_entry_invalid) and nothing else knew, so a
  // checkpoint prepared, committed and published without that participant.
  it("a newer protocol's announcement (fields version 1 lacks) is kept as unreadable under its key, naming both versions", () => {
    const { watched, apply } = registry();
    apply(entry("agent.a1", v1("agent", "a1")));
    apply(entry("agent.a9", { ...v1("agent", "a9"), protocol_version: 2, gpus: 4 }));
    expect(watched.members().map((m) => m.instance)).toEqual(["a1"]);
    const [unreadable] = watched.unreadableMembers();
    expect(unreadable).toMatchObject({ key: "agent.a9", participant: { kind: "agent", instance: "a9" } });
    expect(unreadable!.reason).toMatch(/membership entry agent\.a9 speaks protocol version 2 \(a newer gym-ckpt\); this one speaks protocol version 1 only/);
  });

  // Before: used as a member like any other (nothing checked Member.protocol_version).
  it("an entry in version 1's shape naming protocol_version 2 is not taken for a member", () => {
    const { watched, apply } = registry();
    apply(entry("model.m2", v1("model", "m2", { protocol_version: 2 })));
    expect(watched.members()).toEqual([]);
    expect(watched.unreadableMembers()).toEqual([{ key: "model.m2", participant: { kind: "model", instance: "m2" }, reason: expect.stringMatching(/protocol version 2/) }]);
  });

  it("a corrupt value says why; a key naming no participant keeps its key alone", () => {
    const { watched, apply } = registry();
    apply(entry("environment.e1", "{not json"));
    apply(entry("verifier.v1", v1("agent", "x", { extra_field: 1 })));
    expect(watched.unreadableMembers()).toEqual([
      { key: "environment.e1", participant: { kind: "environment", instance: "e1" }, reason: "membership entry environment.e1 is not a protocol version 1 announcement (not JSON)" },
      { key: "verifier.v1", participant: undefined, reason: expect.stringMatching(/^membership entry verifier\.v1 is not a protocol version 1 announcement \(.*extra_field/) },
    ]);
  });

  it("a delete marker removes it, a readable put replaces it, and it expires like a member whose heartbeat stopped", () => {
    const { watched, apply, clock } = registry();
    apply(entry("agent.a9", v1("agent", "a9", { protocol_version: 2 })));
    apply(entry("agent.a9", null, "DEL"));
    expect(watched.unreadableMembers()).toEqual([]);
    apply(entry("agent.a9", v1("agent", "a9", { protocol_version: 2 })));
    apply(entry("agent.a9", v1("agent", "a9")));
    expect(watched.unreadableMembers()).toEqual([]);
    expect(watched.members().map((m) => m.instance)).toEqual(["a9"]);
    // The key's latest entry is what counts: an unreadable put after a member replaces it.
    apply(entry("agent.a9", v1("agent", "a9", { protocol_version: 2 })));
    expect(watched.members()).toEqual([]);
    expect(watched.unreadableMembers()).toHaveLength(1);
    clock.current += MEMBER_TTL_MS + 1;
    expect(watched.unreadableMembers()).toEqual([]);
  });

  it("readEntry: a delete is a delete, this version's member a member", () => {
    expect(readEntry(entry("agent.a1", null, "DEL"), undefined)).toBeUndefined();
    expect(readEntry(entry("agent.a1", null, "PURGE"), undefined)).toBeUndefined();
    expect(readEntry(entry("agent.a1", v1("agent", "a1")), undefined)).toEqual({ member: v1("agent", "a1") });
  });

  it("participantOfMemberKey inverts memberKey and names nothing for other keys", () => {
    expect(participantOfMemberKey("agent.a1.b")).toEqual({ kind: "agent", instance: "a1.b" });
    for (const key of ["agent", "agent.", ".a1", "gpu.a1", "agent.a..b"]) expect(participantOfMemberKey(key)).toBeUndefined();
  });
});
