import { describe, expect, it } from "vitest";
import { canonicalDigest } from "../../protocol/index.js";
import { EnvironmentKind } from "../../participants/kinds/environment/index.js";
import { createResourcesApp } from "../../participants/kinds/resources/index.js";
import { CounterServer } from "../../participants/gym/resources-server/counter-server.js";
import { phase } from "../support/control-requests.js";
import { participantsOverNats } from "../support/participants-over-nats.js";

// A restore scope naming two attempts of one rollout (r#0 and r#1) would continue the rollout
// twice: r#0 as r-a1 and r#1 as r-a2, while the source fence (the highest source attempt, r#1)
// refuses r-a1 at once, so the reply promised a replacement nobody can run. Each kind did
// something else with it (environment and resources installed both, the model's second record
// deleted the first one's ledger, the agent refused the checkpoint as corrupt). It is refused
// with invalid_request before anything changes, so the same checkpoint restores with a fixed scope.

const { dir, onCleanup, serve, writeRecords } = participantsOverNats("itest-scope", "scope-secret");

const both = [
  { rollout_id: "r", attempt: 0 },
  { rollout_id: "r", attempt: 1 },
];

describe("a restore scope naming two attempts of one rollout", () => {
  it("environment: refused invalid_request, nothing installed or fenced; the same checkpoint restores with one attempt", async () => {
    const digest = canonicalDigest({ task: 1 });
    await writeRecords("c-env", "environment", "env0", [
      { episode_id: both[0], task_digest: digest, boundary: { step: 1 } },
      { episode_id: both[1], task_digest: digest, boundary: { step: 2 } },
    ]);
    const kind = new EnvironmentKind();
    const send = await serve("environment", "env0", kind);
    const before = await send("status", {});

    const refused = await send("restore", phase("c-env", { checkpoint_dir: dir("c-env"), episode_ids: both }));
    expect(refused.error?.code).toBe("invalid_request");
    expect(refused.error.detail).toContain("r");
    expect(await send("status", {})).toEqual(before);
    expect(kind.episodes.pendingKeys()).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);

    // Nothing was fenced or cached: the corrected scope restores the same checkpoint.
    const restored = await send("restore", phase("c-env", { checkpoint_dir: dir("c-env"), episode_ids: [both[1]] }));
    expect(restored).toMatchObject({ phase: "restored", restored: ["r-a2"] });
    expect(kind.episodes.pendingKeys()).toEqual(["r-a2"]);
    expect(await send("resume", phase("c-env"))).toEqual({ phase: "idle", idempotent: false });
  });

  it("resources: refused invalid_request, no session state handed to the server", async () => {
    await writeRecords("c-res", "resources", "res0", [
      { episode_id: both[0], session_id: "sessionAAAA", state: { count: 1 }, owner: null },
      { episode_id: both[1], session_id: "sessionBBBB", state: { count: 5 }, owner: null },
    ]);
    const server = new CounterServer();
    const { app, kind } = await createResourcesApp(server);
    onCleanup(() => app.close());
    const send = await serve("resources", "res0", kind);

    const refused = await send("restore", phase("c-res", { checkpoint_dir: dir("c-res"), episode_ids: both }));
    expect(refused.error?.code).toBe("invalid_request");
    expect([...server.counters.keys()]).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);
    expect((await send("status", {})).phase).toBe("idle");

    const restored = await send("restore", phase("c-res", { checkpoint_dir: dir("c-res"), episode_ids: [both[0]] }));
    expect(restored).toMatchObject({ phase: "restored", restored: ["r-a1"] });
    expect([...server.counters]).toEqual([["sessionAAAA", 1]]);
    expect(await send("resume", phase("c-res"))).toEqual({ phase: "idle", idempotent: false });
  });
});
