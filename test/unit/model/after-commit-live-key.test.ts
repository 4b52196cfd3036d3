import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { deliveredCall, ledgerRow, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

// The model's after-commit hook frees restored ledgers outside the commit scope. It runs outside the
// control-plane lock and may outlive the commit (resume does not wait for it), so a replacement that
// starts meanwhile (the controller may start an attempt it left out of the scope over from input)
// makes its key live again: the hook must not then delete that key's ledger with the new call's row
// (the agent kind guards the same race: "a key the next attempt reopened while the hooks run keeps
// that attempt's state").
let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture();
});
afterEach(async () => {
  await f.close();
});

const row = ledgerRow;

describe("afterCommit racing a replacement's first call", () => {
  it("keeps the ledger of a restored key whose replacement called while the hook ran", async () => {
    await f.kind.install(
      [
        { episode_id: ep("a"), rows: [row("a", "mc-a")], generation_cuts: [] },
        { episode_id: ep("b"), rows: [row("b", "mc-b")], generation_cuts: [] },
      ],
      {},
    );
    await f.kind.openAdmission(); // resumed while the hook still runs
    const hook = f.kind.afterCommit([ep("other")]); // neither a-a1 nor b-a1 is in the scope
    const live = await deliveredCall(f.kind, "b-a1", "fresh start");
    await hook;
    const rows = (await f.kind.ledger.load("b-a1")).rows.map((r) => r.model_call_id);
    expect(rows).toContain(live.modelCallId);
  });
});
