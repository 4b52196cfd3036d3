import { existsSync } from "node:fs";
import { readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { CollectionStateSchema } from "../../coordinator/collect/collection-state.js";
import { parseCaptureKey } from "../../protocol/index.js";
import { CONTROLLER_TOKEN, startGymBase, startGymWorld, type BackendCall, type GymBase, type GymWorld } from "../support/gym-processes.js";

/**
 * `gym-ckpt collect` as a real process against a real nats-server, coordinator and reference Gym:
 * signals, timer checkpoints, crashes at the awkward moments, and the demo itself.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

let world: GymWorld | undefined;
const collectors: ChildProgram[] = [];

/** The nats-server and policy backend every world of this file shares (its call log reset for each). */
let base: Promise<GymBase> | undefined;

afterEach(async () => {
  await Promise.allSettled(collectors.splice(0).map((c) => c.kill("SIGKILL")));
  await world?.close();
  world = undefined;
});
afterAll(async () => {
  await (await base?.catch(() => undefined))?.close();
});

interface Row {
  id: string;
  expression?: string;
  tool_rounds?: number;
}

async function setUp(rows: Row[]): Promise<GymWorld> {
  world = await startGymWorld({ base: await (base ??= startGymBase()) });
  const lines = rows.map((r) => JSON.stringify({ id: r.id, task: { expression: r.expression ?? "17 + 25", tool_rounds: r.tool_rounds ?? 1 } }));
  await writeFile(join(world.root, "tasks.jsonl"), `${lines.join("\n")}\n`);
  return world;
}

async function startCollector(
  w: GymWorld,
  extra: string[] = [],
  env: NodeJS.ProcessEnv = {},
  via: "environment" | "agent" = "environment",
  onLine?: (line: string) => void,
): Promise<ChildProgram> {
  const url = w.gym.urls[via]!;
  const collector = await startChildProgram(
    CLI,
    [
      "collect",
      "--nats-url",
      w.nats.server.url,
      "--deployment",
      w.deployment,
      "--token",
      CONTROLLER_TOKEN,
      "--tasks",
      join(w.root, "tasks.jsonl"),
      "--out",
      join(w.root, "results.jsonl"),
      "--checkpoint-dir",
      w.root,
      "--run-url",
      `${url}/run`,
      "--checkpoint-timeout-s",
      "15",
      ...(process.env.COLLECT_E2E_VERBOSE ? ["--log-level", "info"] : []),
      ...extra,
    ],
    {
      env,
      onLine: (line: string) => {
        onLine?.(line);
        if (process.env.COLLECT_E2E_VERBOSE) console.log(`[collect] ${line}`);
      },
    },
  );
  collectors.push(collector);
  return collector;
}

async function results(w: GymWorld): Promise<Record<string, { attempt: number; reward: number; continued: boolean }>> {
  const text = await readFile(join(w.root, "results.jsonl"), "utf8").catch(() => "");
  const rows = text.split("\n").filter(Boolean).map((l) => JSON.parse(l) as { rollout_id: string; attempt: number; reward: number; continued: boolean });
  return Object.fromEntries(rows.map((r) => [r.rollout_id, { attempt: r.attempt, reward: r.reward, continued: r.continued }]));
}

async function latestCollection(w: GymWorld) {
  const id = (await readFile(join(w.root, "LATEST"), "utf8")).trim();
  return CollectionStateSchema.parse(JSON.parse(await readFile(join(w.root, id, "collection.json"), "utf8")));
}

/** Message counts of one rollout's backend calls, in order, with the delivered ones. */
function callsOf(calls: BackendCall[], rollout: string) {
  const mine = calls.filter((c) => c.capture_key && parseCaptureKey(c.capture_key)?.rollout_id === rollout);
  return { counts: mine.map((c) => c.message_count), delivered: mine.filter((c) => c.delivered).map((c) => c.message_count) };
}

async function callCount(w: GymWorld): Promise<number> {
  return (await w.backend.calls()).length;
}

describe("gym-ckpt collect", () => {
  it.each(["environment", "agent"] as const)("SIGTERM checkpoints, exits 75, and the restart continues the row as attempt 1 (%s /run)", async (via) => {
    const w = await setUp([{ id: "long-1" }]);
    await w.backend.hold(1);
    const first = await startCollector(w, [], {}, via);
    await w.waitFor(async () => (await callCount(w)) === 2, "the second model call to be admitted and held");
    first.child.kill("SIGTERM");
    expect((await first.exited).code).toBe(75);
    expect((await latestCollection(w)).continued).toEqual([{ rollout_id: "long-1", attempt: 0 }]);

    // The scheduler requeues the whole job: fresh Gym processes, the inference server survives.
    await w.crashAndRestart();
    await w.backend.release();
    const second = await startCollector(w, [], {}, via);
    expect((await second.exited).code).toBe(0);

    expect(await results(w)).toEqual({ "long-1": { attempt: 1, reward: 1, continued: true } });
    const { counts, delivered } = callsOf(await w.backend.calls(), "long-1");
    // The delivered first call is not repeated; only the undelivered one is issued again.
    expect(counts).toHaveLength(3);
    expect(counts[2]).toBe(counts[1]);
    expect(new Set(delivered).size).toBe(delivered.length);
  });

  it("SIGUSR1 publishes a checkpoint and the collection continues", async () => {
    const w = await setUp([{ id: "a" }, { id: "b" }, { id: "c" }]);
    await w.backend.hold(0);
    const collector = await startCollector(w);
    await w.waitFor(async () => (await callCount(w)) === 3, "every row's first model call to be held");
    collector.child.kill("SIGUSR1");
    await w.waitFor(() => existsSync(join(w.root, "LATEST")), "the SIGUSR1 checkpoint");
    const state = await latestCollection(w);
    expect(state.continued.map((e) => e.rollout_id).sort()).toEqual(["a", "b", "c"]);
    await w.backend.release();
    expect((await collector.exited).code).toBe(0);
    const done = await results(w);
    expect(Object.keys(done).sort()).toEqual(["a", "b", "c"]);
    expect(Object.values(done).every((r) => r.attempt === 0 && r.reward === 1)).toBe(true);
  });

  it("checkpoints on a timer while rows are in flight, keeping the two newest", async () => {
    const w = await setUp([{ id: "t1" }, { id: "t2" }]);
    await w.backend.hold(0);
    const collector = await startCollector(w, ["--checkpoint-every", "0.5"]);
    await w.waitFor(async () => (await w.client.list()).checkpoints.length >= 2 && existsSync(join(w.root, "LATEST")), "two timer checkpoints");
    await w.waitFor(async () => {
      const published = (await w.client.list()).checkpoints;
      return published.length === 2; // retention keeps the newest two as more are taken
    }, "retention to settle at two");
    await w.backend.release();
    expect((await collector.exited).code).toBe(0);
    expect(Object.keys(await results(w)).sort()).toEqual(["t1", "t2"]);
  });

  it("a crash before the first checkpoint restores nothing and restarts the rows cleanly", async () => {
    const w = await setUp([{ id: "x" }, { id: "y" }]);
    await w.backend.hold(0);
    const first = await startCollector(w);
    await w.waitFor(async () => (await callCount(w)) === 2, "both rows to be running");
    await first.kill("SIGKILL");
    await w.crashAndRestart();
    await w.backend.release();
    expect(existsSync(join(w.root, "LATEST"))).toBe(false);
    const second = await startCollector(w);
    expect((await second.exited).code).toBe(0);
    expect(await results(w)).toEqual({
      x: { attempt: 1, reward: 1, continued: false },
      y: { attempt: 1, reward: 1, continued: false },
    });
    // Every server ends with nothing retired left over: the collector forgot what it retired.
    for (const name of ["environment", "agent", "model", "resources"] as const) expect((await w.status(name)).retired_rollouts).toBe(0);
  });

  it("a crash after the restore but before the re-dispatch still finishes the row without repeating delivered calls", async () => {
    const w = await setUp([{ id: "late" }]);
    await w.backend.hold(1);
    const first = await startCollector(w);
    await w.waitFor(async () => (await callCount(w)) === 2, "the second model call to be held");
    first.child.kill("SIGTERM");
    expect((await first.exited).code).toBe(75);
    await w.crashAndRestart();
    await w.backend.release();

    const crashing = await startCollector(w, [], { GYM_CKPT_TEST_CRASH_AT: "after-restore" });
    expect((await crashing.exited).signal).toBe("SIGKILL");
    const last = await startCollector(w);
    expect((await last.exited).code).toBe(0);

    const done = (await results(w)).late!;
    expect(done.reward).toBe(1);
    expect(done.attempt).toBeGreaterThanOrEqual(1);
    const { delivered } = callsOf(await w.backend.calls(), "late");
    expect(new Set(delivered).size).toBe(delivered.length);
  });
});

describe("gym-ckpt collect start-up failures", () => {
  it("a start-up refusal over NATS exits 1 at once (its connection is closed) and leaves no collector.pid", async () => {
    const w = await setUp([{ id: "a" }]);
    await writeFile(join(w.root, "results.jsonl"), "not json\n{}\n");
    const output: string[] = [];
    const collector = await startCollector(w, [], {}, "environment", (line) => output.push(line));
    const outcome = await Promise.race([collector.exited, new Promise((resolve) => setTimeout(() => resolve("still running after 10 s"), 10_000))]);
    expect(outcome, output.join("\n")).toEqual({ code: 1, signal: null });
    expect(output.some((line) => line.startsWith("error invalid_checkpoint_state: "))).toBe(true);
    expect(existsSync(join(w.root, "collector.pid"))).toBe(false);
  });
});

describe("the demo (shortened)", () => {
  it("finishes every row and repeats no delivered model call; --keep keeps the Gym's and the backend's logs", { timeout: 240_000 }, async () => {
    const output: string[] = [];
    const demo = await startChildProgram(CLI, ["demo", "--rows", "12", "--concurrency", "4", "--checkpoint-every", "1", "--token-delay-ms", "30", "--crash-after", "0.3", "--keep"], {
      onLine: (line) => output.push(line),
      group: true, // teardown's kill reaches the nats-server, coordinator and Gym servers it started
    });
    collectors.push(demo);
    const { code } = await demo.exited;
    if (code !== 0) console.error(output.join("\n"));
    expect(code, output.join("\n")).toBe(0);
    expect(output).toContain("[demo] demo passed: every row finished and no delivered model call was repeated");
    expect(output.some((line) => /rows finished: 12\/12/.test(line))).toBe(true);
    const work = /work directory kept: (\S+)/.exec(output.join("\n"))?.[1];
    expect(work).toBeDefined();
    try {
      // Both Gym runs' servers, each line naming its server; the backend's own lines beside them.
      const gymLog = await readFile(join(work!, "gym.log"), "utf8");
      for (const server of ["environment", "agent", "model", "resources"]) expect(gymLog).toMatch(new RegExp(`^\\[${server}\\] `, "m"));
      expect((await readFile(join(work!, "policy-backend.log"), "utf8")).length).toBeGreaterThan(0);
      expect(existsSync(join(work!, "backend-calls.json"))).toBe(true);
    } finally {
      await rm(work!, { recursive: true, force: true });
    }
  });
});
