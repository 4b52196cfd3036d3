import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";
import type { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { ReplayTaskSource, gymSourceEnvironment } from "../../../participants/replay/index.js";
import { silent, tempDir } from "./fixtures.js";

/**
 * A corrupt record file under a served replay source is `invalid_checkpoint_state`
 * (docs/replay.md, "Errors"), whichever route finds it. Today /replay/info and /replay/next answer
 * `internal_error` (500: toCheckpointError does not know ReplayError) and /run `invalid_request`
 * (400: every taskAt failure is rewrapped), though the request was fine.
 */
let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

describe("the environment server's replay routes over a corrupt record file", () => {
  it("answer invalid_checkpoint_state (422) on /replay/info, /replay/next and /run", async () => {
    await mkdir(path.join(dir, "rollouts", "step_1"), { recursive: true });
    await writeFile(path.join(dir, "rollouts", "step_1", "train_rollouts_gym.jsonl"), "not json\n");
    const replay = new ReplayTaskSource({ records: "rollouts/step_*/train_rollouts_gym.jsonl", source: { id: "reference-gym" } }, gymSourceEnvironment, { cwd: dir, logger: silent });
    const kind = { kind: "environment", statusExtras: () => ({}), begin: async () => ({}) } as unknown as EnvironmentKind;
    const app = createEnvironmentApp({ kind, endpoints: {} as never, replay });
    await app.ready();
    const run = { rollout_id: "r", attempt: 0, task: { expression: "1 + 1", tool_rounds: 1 }, replay_idx: 0, replay_id: "a".repeat(64) };
    const answers = [
      await app.inject({ method: "GET", url: "/replay/info" }),
      await app.inject({ method: "POST", url: "/replay/next" }),
      await app.inject({ method: "POST", url: "/run", payload: run }),
    ].map((r) => [r.statusCode, (r.json() as { error?: { code: string } }).error?.code]);
    await app.close();
    expect(answers).toEqual([
      [422, "invalid_checkpoint_state"],
      [422, "invalid_checkpoint_state"],
      [422, "invalid_checkpoint_state"],
    ]);
  });
});
