import { randomBytes, randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { IncarnationSchema, MAX_INCARNATION_CHARS } from "../../../protocol/index.js";
import { JournalEntrySchema, MAX_JOURNAL_ENTRY_BYTES, assertJournalEntryFits } from "../../../coordinator/ha/decision-journal.js";

/** Bytes an incarnation takes in a journal entry's JSON, its quotes left out. */
const jsonBytes = (incarnation: string) => Buffer.byteLength(JSON.stringify(incarnation)) - 2;

describe("incarnation size", () => {
  it("an incarnation the schema accepts takes at most MAX_INCARNATION_CHARS bytes of JSON (the coordinator sizes journal entries by it)", () => {
    // JSON writes a control character as \u00XX (6 bytes), `"` and `\` escaped (2), non-ASCII as 2-4 bytes of UTF-8.
    for (const incarnation of ["\u0000".repeat(64), '"'.repeat(64), "\\".repeat(64), "é".repeat(64), "😀".repeat(32)]) {
      const accepted = IncarnationSchema.safeParse(incarnation).success;
      expect([JSON.stringify(incarnation).slice(0, 14), accepted && jsonBytes(incarnation) > MAX_INCARNATION_CHARS]).toEqual([JSON.stringify(incarnation).slice(0, 14), false]);
    }
    // What participants generate (hex), and what another implementation would likely use.
    for (const incarnation of [randomBytes(8).toString("hex"), randomUUID(), "x".repeat(MAX_INCARNATION_CHARS)]) expect(IncarnationSchema.safeParse(incarnation).success).toBe(true);
  });

  it("a resuming entry the engine sized with the longest incarnation fits with any incarnation the schema accepts", () => {
    // The engine checks a restore's resuming entry with "x".repeat(MAX_INCARNATION_CHARS) per member
    // (the restorers' incarnations are known only from the replies), then writes the replies' own.
    const members = Array.from({ length: 200 }, (_, i) => ({ kind: "environment" as const, instance: `e${i}` }));
    const entry = (incarnation: string, restarts: string[]) => ({
      checkpoint_id: "c1",
      epoch: 1,
      state: "resuming" as const,
      participants: members,
      prepared_at: 1,
      checkpoint_dir: "/root/c1",
      scope: null,
      stop: false,
      restarts,
      auto_publish: false,
      controller_state: null,
      incarnations: Object.fromEntries(members.map((m) => [`${m.kind}.${m.instance}`, incarnation])),
      updated_at: 1,
    });
    const sized = Buffer.byteLength(JSON.stringify(entry("x".repeat(MAX_INCARNATION_CHARS), [])));
    // Restarts filling the entry to 1 KiB under the limit, as the engine's check lets through.
    const restarts = Array.from({ length: Math.floor((MAX_JOURNAL_ENTRY_BYTES - 1024 - sized) / 11) }, (_, i) => `r${String(i).padStart(7, "0")}`);
    assertJournalEntryFits(JournalEntrySchema.parse(entry("x".repeat(MAX_INCARNATION_CHARS), restarts)));
    const escaped = "\u0001".repeat(MAX_INCARNATION_CHARS);
    const parsed = JournalEntrySchema.safeParse(entry(escaped, restarts));
    // Either such an incarnation is refused where it arrives (the reply's schema), or its entry fits.
    if (parsed.success) expect(() => assertJournalEntryFits(parsed.data)).not.toThrow();
  });
});
