import * as fsPromises from "node:fs/promises";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CHAT, chat, ledgerRow, modelFixture, settle, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

// The unlink of a ledger file waits while `gate` is set: the after-commit hook's removal is then
// under way (past its "does a call keep it?" check) for as long as the test says.
let gate: { key: string; reached: boolean; open: Promise<void>; release: () => void } | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const actual = await importOriginal<typeof fsPromises>();
  return {
    ...actual,
    unlink: async (path: Parameters<typeof actual.unlink>[0]) => {
      if (gate && String(path).endsWith(`/${gate.key}.lineage.jsonl`)) {
        gate.reached = true;
        await gate.open;
      }
      return actual.unlink(path);
    },
  };
});

function gateUnlinkOf(key: string): NonNullable<typeof gate> {
  let release!: () => void;
  const open = new Promise<void>((resolve) => (release = resolve));
  gate = { key, reached: false, open, release };
  return gate;
}

let f: ModelFixture;
beforeEach(async () => {
  gate = undefined;
  f = await modelFixture();
});
afterEach(async () => {
  gate?.release();
  gate = undefined;
  await f.close();
});

describe("afterCommit freeing a restored ledger while a call of its key is admitted", () => {
  it("a call arriving while the removal is under way starts after it, from no rows: never the parent of a row being deleted", async () => {
    await f.kind.install([{ episode_id: ep("a"), rows: [ledgerRow("a", "mc-restored")], generation_cuts: [] }], {});
    const unlink = gateUnlinkOf("a-a1");
    const hook = f.kind.afterCommit([ep("other")]); // a-a1 is left out: freed
    for (let i = 0; i < 100 && !unlink.reached; i++) await settle(1);
    expect(unlink.reached).toBe(true);
    const admitted = f.kind.admit("a-a1", CHAT, chat("start over"));
    await settle();
    unlink.release();
    await hook;
    const ticket = await admitted;
    // Before: parent mc-restored, read from the rows the hook then deleted.
    expect(ticket.parentCallId).toBeNull();
    await f.kind.responseStart(ticket);
    await f.kind.complete(ticket, { stagingKey: null, usage: null });
    expect((await f.kind.ledger.rows("a-a1")).map((r) => [r.model_call_id, r.parent_call_id])).toEqual([[ticket.modelCallId, null]]);
  });

  it("a call being admitted when the removal would start keeps the ledger, and continues its last row", async () => {
    await f.kind.install([{ episode_id: ep("a"), rows: [ledgerRow("a", "mc-restored")], generation_cuts: [] }], {});
    f.kind.ledger.evict("a"); // its rows are read from the file, under the stripe lock
    let release!: () => void;
    const held = f.kind.ledger.locks.run("a-a1", () => new Promise<void>((resolve) => (release = resolve)));
    const admitted = f.kind.admit("a-a1", CHAT, chat("start over")); // waits for the stripe to read the rows
    const hook = f.kind.afterCommit([ep("other")]); // its removal queues behind that read
    await settle();
    release();
    await held;
    await hook;
    const ticket = await admitted;
    expect(ticket.parentCallId).toBe("mc-restored");
    await f.kind.responseStart(ticket);
    await f.kind.complete(ticket, { stagingKey: null, usage: null });
    expect((await f.kind.ledger.rows("a-a1")).map((r) => r.model_call_id)).toEqual(["mc-restored", ticket.modelCallId]);
  });
});
