import { expect, it } from "vitest";
import { ResourcesKind, type JsonValue, type ResourcesSessionRecord } from "../../../participants/kinds/resources/index.js";
import { refusalOf } from "../../support/refusal.js";
import { ep } from "../../support/episode.js";

it.each(["exported", "stateless"] as const)(
  "restore refuses sessions holding one rollout at two attempts (invalid_checkpoint_state naming both), installing nothing (%s)",
  async (mode) => {
    const restored: Record<string, JsonValue>[] = [];
    const kind = new ResourcesKind({
      mode,
      verify: "wait",
      hooks: {
        async exportSessionStates(ids) {
          return Object.fromEntries(ids.map((id) => [id, null]));
        },
        async restoreSessionStates(states) {
          restored.push(states);
        },
        async retireSessionState() {},
      },
    });
    kind.attach({ notifyReadinessChanged() {}, isRetired: () => false });
    const state = mode === "exported" ? { n: 1 } : null;
    // Two sessions (ids differ) of r1 at attempts 0 and 1: each would continue as its next attempt.
    const records: ResourcesSessionRecord[] = [
      { episode_id: ep("r1"), session_id: "session-a0", state, owner: null },
      { episode_id: ep("r2"), session_id: "session-r2", state, owner: null },
      { episode_id: ep("r1", 1), session_id: "session-a1", state, owner: null },
    ];
    const refusal = await refusalOf(kind.install(records));
    expect(refusal.code).toBe("invalid_checkpoint_state");
    expect(refusal.message).toContain("rollout r1 at attempts 0 and 1");
    expect(restored).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);
  },
);

it("sessions of one rollout at two attempts: the commit exports the current (highest) attempt alone", async () => {
  const kind = new ResourcesKind({ mode: "stateless", verify: "wait" });
  kind.attach({ notifyReadinessChanged() {}, isRetired: () => false });
  kind.bind("session-a0", ep("r1")); // never retired: the controller re-dispatched r1
  kind.bind("session-a1", ep("r1", 1));
  kind.bind("session-r2", ep("r2"));
  try {
    const exported = (await kind.exportRecords(null)).map((r) => `${r.session_id}:${r.episode_id.rollout_id}-a${r.episode_id.attempt}`);
    expect(exported.sort()).toEqual(["session-a1:r1-a1", "session-r2:r2-a0"]);
  } finally {
    kind.dispose();
  }
});
