import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { EpisodeId } from "../../../protocol/index.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";
import { readResults } from "../../../coordinator/collect/results-file.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";

/**
 * gym-ckpt collect against the reference environment server whose agent refuses the first
 * attempt's `activate` with `invalid_request` (a state of the agent's, not the task: say a session
 * still open with another cookie). The environment's `/run` used to answer that code as its own,
 * and the collector failed the row for good ("/run refused the task"); it now answers
 * `upstream_failed`, so the attempt is retired and the row sent again as the next one.
 */
let dir: string;
const servers: Server[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-callee-refusal-"));
});
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
  await rm(dir, { recursive: true, force: true });
});

/** The agent and resources server in one: every call answered, but the first activate refused. */
async function callees(activations: string[]): Promise<string> {
  const server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const path = req.url ?? "";
      const answer = (status: number, body: unknown, headers: Record<string, string> = {}) => {
        res.writeHead(status, { "content-type": "application/json", ...headers });
        res.end(JSON.stringify(body));
      };
      if (path.endsWith("/activate")) {
        activations.push(path.split("/")[2]!);
        if (activations.length === 1) return answer(400, { error: { code: "invalid_request", detail: "session a is open with another cookie; close it first" } });
        return answer(200, { answer: "42", messages: [] });
      }
      if (path.endsWith("/seed_session")) return answer(200, {}, { "set-cookie": "ng_session=s1; Path=/" });
      if (path.endsWith("/verify")) return answer(200, { reward: 1 });
      return answer(200, {});
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}`;
}

describe("collect, when a callee of /run refused a call", () => {
  it("retires the attempt and sends the row again as the next one, instead of failing it as a bad task", async () => {
    const activations: string[] = [];
    const calleeUrl = await callees(activations);
    const app = createEnvironmentApp({ kind: new EnvironmentKind(), endpoints: { agentUrl: calleeUrl, resourcesUrl: calleeUrl } });
    await app.listen({ port: 0, host: "127.0.0.1" });
    servers.push(app.server);
    const runUrl = `http://127.0.0.1:${(app.server.address() as { port: number }).port}/run`;
    const retired: EpisodeId[] = [];
    const controller = idleController({ retire: async (req: { episode_ids: EpisodeId[] }) => (retired.push(...req.episode_ids), { participants: [] }) });
    const collector = collectorIn(dir, runUrl, controller, { rows: [{ rolloutId: "a", task: { expression: "6*7", tool_rounds: 1 } }], retryPauses: { retireS: 0.1, resendS: 0.1 } });
    try {
      await collector.start();
      expect(await collector.run()).toMatchObject({ finished: 1, failed: 0 });
      expect(activations).toEqual(["a", "a-a1"]);
      expect(retired).toContainEqual({ rollout_id: "a", attempt: 0 });
      const results = await readResults(join(dir, "results.jsonl"));
      expect([...results.values()].map((r) => [r.rollout_id, r.attempt, r.reward])).toEqual([["a", 1, 1]]);
    } finally {
      await app.close();
    }
  });
});
