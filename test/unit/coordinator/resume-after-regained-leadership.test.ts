import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "../coordinator/fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-engine-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/**
 * docs/api.md resume: a restore's resume whose journal entry cannot be removed before leadership is
 * lost answers outcome_unknown: "retry it (a successor may still finish it as a restore whose
 * participant restarted, restore_failed)". Here the successor did exactly that (clean-up: attempt+1
 * retired everywhere, entry removed), then this coordinator became leader again. leadershipLost()
 * cleared restoreRemovals but kept `closed`, so the controller's retry is answered "resumed" from the
 * previous term's memory (the new fast path answers it without even a deadline check): the controller
 * continues rollouts whose attempt+1 was retired.
 */
describe("resume retried at a coordinator that lost and regained leadership meanwhile", () => {
  it("does not answer success from the previous term's memory", async () => {
    const { engine, journal, clock } = makeEngine(root, { requireRecovery: true });
    await engine.recover();
    await engine.checkpoint({ checkpoint_id: "rx", episode_ids: null, stop: false, controller_state: null });
    for (let i = 0; i < 200 && journal.entries.size > 0; i++) await new Promise((r) => setTimeout(r, 10));
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "rx", deadline_ts, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    // the entry's removal fails until leadership is lost
    const remove = journal.remove.bind(journal);
    let failing = true;
    journal.remove = async (id) => {
      if (failing) {
        engine.leadershipLost();
        throw new Error("journal timeout (scripted)");
      }
      return remove(id);
    };
    expect((await refusalOf(engine.resume({ checkpoint_id: "rx", deadline_ts }))).code).toBe("outcome_unknown");
    expect(journal.entries.get("rx")?.state).toBe("resuming");
    // A successor recovered the entry, found a restorer restarted, ran the restore's clean-up
    // (attempt+1 retired everywhere, restore_failed) and removed the entry. Then it died and this
    // coordinator is the leader again.
    failing = false;
    await remove("rx");
    await engine.recover();
    // the controller's retry (from the outcome_unknown) reaches this coordinator
    const retry = await engine.resume({ checkpoint_id: "rx", deadline_ts }).then(
      (reply) => ({ ok: true as const, reply }),
      (error: { code: string }) => ({ ok: false as const, code: error.code }),
    );
    expect(retry).not.toMatchObject({ ok: true });
  });
});
