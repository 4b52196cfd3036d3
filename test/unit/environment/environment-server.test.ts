import { describe, expect, it } from "vitest";
import { canonicalDigest } from "../../../protocol/index.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";
import { RECORDED_AND_SENT_SPELLINGS, expectRestoredTaskChecks } from "../../support/task-spellings.js";

describe("reference environment server", () => {
  it("/run refuses a restored boundary that is not an environment boundary with invalid_checkpoint_state, keeping the record", async () => {
    const kind = new EnvironmentKind();
    const task = { expression: "1+1", tool_rounds: 1 };
    await kind.install([{ episode_id: { rollout_id: "r1", attempt: 1 }, task_digest: canonicalDigest(task), boundary: { next: "bogus" } }]);
    const app = createEnvironmentApp({ kind, endpoints: { agentUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9" } });
    try {
      for (let i = 0; i < 2; i++) {
        const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 2, task } });
        expect(res.statusCode).toBe(422);
        expect(res.json()).toMatchObject({ error: { code: "invalid_checkpoint_state" } });
        expect(kind.episodes.pendingKeys()).toEqual(["r1-a2"]);
        expect(kind.episodes.steps.size).toBe(0);
      }
    } finally {
      await app.close();
    }
  });

  it("/run takes a restored record digested with or without the task's defaults, and refuses another task with invalid_request", async () => {
    for (const [recorded, sent] of RECORDED_AND_SENT_SPELLINGS) {
      const kind = new EnvironmentKind();
      await kind.install([{ episode_id: { rollout_id: "r1", attempt: 1 }, task_digest: canonicalDigest(recorded), boundary: { next: "bogus" } }]);
      const app = createEnvironmentApp({ kind, endpoints: { agentUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9" } });
      try {
        await expectRestoredTaskChecks(app, sent);
        expect(kind.episodes.pendingKeys()).toEqual(["r1-a2"]);
        expect(kind.episodes.steps.size).toBe(0);
      } finally {
        await app.close();
      }
    }
  });
});
