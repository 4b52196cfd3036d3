import { expect, it } from "vitest";
import type { EpisodeId } from "../../../protocol/index.js";
import { AgentSessions } from "../../../participants/kinds/agent/agent-sessions.js";
import { ResourcesKind } from "../../../participants/kinds/resources/resources-kind.js";
import { HeldInstallFailure } from "../../../participants/control-plane/held-install-failure.js";
import { countingReads } from "../../support/read-counts.js";
import { ep } from "../../support/episode.js";

/**
 * A retire may name up to 100,000 episodes (the restore clean-up retires attempt+1 of a whole scope
 * at every member). Each kind looks its sessions up in the retired episodes: read once, not once per
 * session (which at 16,000 sessions blocked a resources server's event loop for a second).
 */
const N = 2000;
const episodes = (attempt: number): EpisodeId[] => Array.from({ length: N }, (_, i) => ep(`r${i}`, attempt));

it("a resources retire of N episodes over N sessions reads the episode list O(N) times, and retires them all", async () => {
  const kind = new ResourcesKind({ mode: "restart_only", verify: "replay", unusedSeedLifetimeMs: 0 });
  for (let i = 0; i < N; i++) kind.bind(`s${i}`, ep(`r${i}`));
  kind.bind("other", ep("not-retired"));
  const { array, reads } = countingReads(episodes(0));
  await kind.retire(array);
  expect(reads()).toBeLessThanOrEqual(2 * N);
  expect(kind.sessionEpisode("s0")).toBeUndefined();
  expect(kind.sessionEpisode(`s${N - 1}`)).toBeUndefined();
  expect(kind.sessionEpisode("other")).toEqual(ep("not-retired"));
  kind.dispose();
});

it("an agent retire of N episodes over N sessions reads the episode list O(N) times, and retires them all", async () => {
  const sessions = new AgentSessions(() => false);
  sessions.installRestored(Array.from({ length: N }, (_, i) => ({ key: `k${i}`, episode: ep(`r${i}`, 1), boundary: null })));
  sessions.installRestored([{ key: "other", episode: ep("r0", 2), boundary: null }]);
  const { array, reads } = countingReads(episodes(1));
  const retired = await sessions.retire(array);
  expect(reads()).toBeLessThanOrEqual(2 * N);
  expect(retired).toHaveLength(N); // attempt 2 of r0 is above the retired attempt
});

it("a held install failure is let go by a retire or forget of N episodes in O(N) reads", () => {
  const held = new HeldInstallFailure();
  held.remember("c1", "args", new Error("x"), episodes(1));
  const retire = countingReads(episodes(1));
  held.retired(retire.array);
  expect(retire.reads()).toBeLessThanOrEqual(2 * N);
  expect(held.holds("c1")).toBe(false);

  held.remember("c1", "args", new Error("x"), episodes(1));
  const forget = countingReads(episodes(1).map((e) => e.rollout_id));
  held.forgotten(forget.array);
  expect(forget.reads()).toBeLessThanOrEqual(2 * N);
  expect(held.holds("c1")).toBe(false);
});
