import { describe, expect, it } from "vitest";
import { captureKey, type EpisodeId } from "../../../protocol/index.js";
import { RestorableEpisodes } from "../../../participants/kinds/environment/restorable-episodes.js";

describe("RestorableEpisodes.exportSnapshots", () => {
  it("leaves out a pending restored record whose attempt is fenced, with a null scope or one naming it", () => {
    // The control plane's marks, scripted: today every retire drops the record before a commit can
    // run, so this guards the rule (exports leave out retired attempts) rather than a reachable race.
    const fenced = new Set<string>();
    const episodes = new RestorableEpisodes((e: EpisodeId) => fenced.has(captureKey(e)));
    episodes.install([
      { episode_id: { rollout_id: "r1", attempt: 0 }, task_digest: "d1", boundary: null },
      { episode_id: { rollout_id: "r2", attempt: 0 }, task_digest: "d2", boundary: null },
    ]);
    fenced.add("r1-a1");
    const keys = (scope: EpisodeId[] | null) => episodes.exportSnapshots(scope).map((s) => captureKey(s.episode_id));
    expect({ all: keys(null), named: keys([{ rollout_id: "r1", attempt: 1 }]) }).toEqual({ all: ["r2-a1"], named: [] });
  });
});
