import { Writable } from "node:stream";
import { Kvm } from "@nats-io/kv";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { journalBucket } from "../../protocol/index.js";
import { journalEntry } from "../unit/coordinator/fake-participants.js";
import { startNats, type NatsFixture } from "../support/nats.js";

let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

function capturingLogger(): { logger: pino.Logger; records: () => Record<string, unknown>[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(chunk.toString());
      done();
    },
  });
  return { logger: pino({ level: "info" }, sink), records: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

describe("KV decision journal", () => {
  it("skips and logs a value that is not JSON or not an entry, and still lists the valid ones", async () => {
    const { logger, records } = capturingLogger();
    const journal = await KvDecisionJournal.open(nats.nc, "jbad", logger);
    const valid = journalEntry({ checkpoint_id: "c-ok", state: "open", participants: [{ kind: "environment", instance: "e1" }] });
    await journal.record(valid);
    // Values nothing in the coordinator wrote (an operator's `nats kv put`, a foreign tool).
    const kv = await new Kvm(nats.nc).open(journalBucket("jbad"));
    await kv.put("c-garbage", "not json {");
    await kv.put("c-foreign", JSON.stringify({ checkpoint_id: "c-foreign", state: "whatever" }));

    expect(await journal.list()).toEqual([valid]);
    const skipped = records().filter((r) => typeof r.msg === "string" && (r.msg as string).startsWith("journal_entry_"));
    expect(skipped.map((r) => [r.msg, r.key, r.component])).toEqual(
      expect.arrayContaining([
        ["journal_entry_not_json_skipped", "c-garbage", "journal"],
        ["journal_entry_invalid_skipped", "c-foreign", "journal"],
      ]),
    );
    expect(skipped).toHaveLength(2);
    // Skipped, not removed: an operator can still inspect them.
    expect((await kv.get("c-garbage"))?.string()).toBe("not json {");
  });
});
