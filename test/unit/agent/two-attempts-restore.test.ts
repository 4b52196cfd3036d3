import { expect, it } from "vitest";
import { AgentKind, type RestoredAgentSession } from "../../../participants/kinds/agent/index.js";
import type { AgentRecord } from "../../../participants/kinds/agent/agent-record.js";
import { refusalOf } from "../../support/refusal.js";
import { ep } from "../../support/episode.js";

/**
 * A checkpoint captures each rollout once, at its current attempt: records holding one rollout at
 * two attempts are refused (invalid_checkpoint_state naming both) before anything is installed, in
 * the legacy records and across native sessions (each under its own key) and legacy ones alike.
 */
function kindWithHooks() {
  const restored: RestoredAgentSession[][] = [];
  const kind = new AgentKind({
    async exportAgentSessions(keys) {
      return Object.fromEntries(keys.map((key) => [key, null]));
    },
    async restoreAgentSessions(sessions) {
      restored.push(sessions);
    },
    async retireAgentSession() {},
  });
  kind.attach({ notifyReadinessChanged() {}, isRetired: () => false });
  return { kind, restored };
}

const DIGEST = "a".repeat(64);
const session = (rollout: string, attempt: number, key: string): AgentRecord => ({ episode_id: ep(rollout, attempt), mode: "session", session_key: key, session: null, boundary: null, episode: null });
const legacy = (rollout: string, attempt: number): AgentRecord => ({ episode_id: ep(rollout, attempt), mode: "legacy", session_key: rollout, session: { task_digest: DIGEST }, boundary: null, episode: null });

it.each([
  ["two native sessions under their own keys", [session("r1", 0, "k1"), session("r2", 0, "r2"), session("r1", 1, "k2")]],
  ["a native session and a legacy episode", [legacy("r1", 1), session("r1", 0, "r1")]],
])("restore refuses one rollout at two attempts in %s, installing nothing", async (_name, records) => {
  const { kind, restored } = kindWithHooks();
  const refusal = await refusalOf(kind.install(records));
  expect(refusal.code).toBe("invalid_checkpoint_state");
  expect(refusal.message).toContain("rollout r1 at attempts 0 and 1");
  expect(restored).toEqual([]);
  expect(kind.hasLiveState()).toBe(false);
});

it("a legacy episode's later attempt running beside its pending restored record is exported alone: never both attempts of the rollout", async () => {
  const { kind } = kindWithHooks();
  await kind.install([legacy("r1", 0)]);
  expect(kind.legacy.pendingKeys()).toEqual(["r1-a1"]);
  // attempt 2 runs from input beside the record pending as attempt 1, parked at a boundary
  const parked = kind.runLegacy(ep("r1", 2), { task: 1 }, {}, async (e) => {
    await e.boundary({ next: "verify" });
    return e.step("replay", (signal) => new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true })));
  });
  void parked.catch(() => undefined);
  const until = Date.now() + 5000;
  while (kind.legacy.steps.exportable().length === 0 && Date.now() < until) await new Promise((resolve) => setImmediate(resolve));
  const exported = (await kind.exportRecords(null)).map((r) => `${r.mode}:${r.episode_id.rollout_id}-a${r.episode_id.attempt}`);
  expect(exported).toEqual(["legacy:r1-a2"]);
  await kind.retire([ep("r1", 2)]);
  await parked.catch(() => undefined);
});

it("native sessions of one rollout under two keys at two attempts: the commit exports the current (highest) attempt alone", async () => {
  const { kind } = kindWithHooks();
  kind.openSession(ep("r1"), "k1"); // never retired: the controller re-dispatched r1 under another key
  kind.openSession(ep("r1", 1), "k2");
  kind.openSession(ep("r1", 1), "k3"); // a second session of the current attempt is kept
  kind.openSession(ep("r2"), "r2");
  const exported = (await kind.exportRecords(null)).map((r) => `${r.session_key}:${r.episode_id.rollout_id}-a${r.episode_id.attempt}`);
  expect(exported.sort()).toEqual(["k2:r1-a1", "k3:r1-a1", "r2:r2-a0"]);
});
