import { readFile, readdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { CONTROLLER_TOKEN, startGymBase, startGymWorld, type GymBase, type GymWorld } from "../support/gym-processes.js";

/**
 * Two collections over one tasks file against one Gym: the model proxy keeps each capture key's
 * ledger file, so a second run sending the same rollout ids at the same attempts continued the
 * first run's lineage (its first call's parent was the first run's last call, one ledger held both
 * runs' rows). `--rollout-id-prefix` gives each run ids of its own.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

let world: GymWorld | undefined;
let base: Promise<GymBase> | undefined;
/** Each collection started: one still running when its test failed is killed, not left behind. */
const collectors: ChildProgram[] = [];
afterEach(async () => {
  await Promise.allSettled(collectors.splice(0).map((c) => c.kill("SIGKILL")));
  await world?.close();
  world = undefined;
});
afterAll(async () => {
  await (await base?.catch(() => undefined))?.close();
});

interface Row {
  capture_key: string;
  model_call_id: string;
  parent_call_id: string | null;
}

async function collect(w: GymWorld, out: string, extra: string[]): Promise<number | null> {
  const child = await startChildProgram(CLI, [
    "collect",
    "--nats-url", w.nats.server.url,
    "--deployment", w.deployment,
    "--token", CONTROLLER_TOKEN,
    "--tasks", join(w.root, "tasks.jsonl"),
    "--out", join(w.root, out),
    "--checkpoint-dir", w.root,
    "--run-url", `${w.gym.urls.environment}/run`,
    ...extra,
  ]);
  collectors.push(child);
  return (await child.exited).code;
}

async function ledgers(w: GymWorld): Promise<Map<string, Row[]>> {
  const dir = join(w.root, "model-ledger");
  const files = (await readdir(dir)).filter((f) => f.endsWith(".lineage.jsonl"));
  const byKey = new Map<string, Row[]>();
  for (const file of files) {
    const text = await readFile(join(dir, file), "utf8");
    byKey.set(file.slice(0, -".lineage.jsonl".length), text.split("\n").filter(Boolean).map((l) => JSON.parse(l) as Row));
  }
  return byKey;
}

describe("collect --rollout-id-prefix", () => {
  it("two runs over the same tasks with their own prefixes keep one lineage each", async () => {
    world = await startGymWorld({ base: await (base ??= startGymBase()) });
    const w = world;
    // One row with an id, one without (row-2): both spellings get the prefix.
    await writeFile(join(w.root, "tasks.jsonl"), `${JSON.stringify({ id: "q1", task: { expression: "17 + 25", tool_rounds: 1 } })}\n${JSON.stringify({ expression: "2 + 3", tool_rounds: 1 })}\n`);
    expect(await collect(w, "results-1.jsonl", ["--rollout-id-prefix", "run1."])).toBe(0);
    // A new collection in the same root: the first finished every row it sent, so it starts
    // without --new-collection (one with rows unfinished is refused: collect-flags.test.ts).
    expect(await collect(w, "results-2.jsonl", ["--rollout-id-prefix", "run2."])).toBe(0);

    const byKey = await ledgers(w);
    expect([...byKey.keys()].sort()).toEqual(["run1.q1", "run1.row-2", "run2.q1", "run2.row-2"]);
    for (const [key, rows] of byKey) {
      // 2 calls per row (one tool round, then the answer), chained from null within the run.
      expect(rows.map((r) => r.capture_key)).toEqual([key, key]);
      expect(rows[0]!.parent_call_id).toBeNull();
      expect(rows[1]!.parent_call_id).toBe(rows[0]!.model_call_id);
    }
    // results.jsonl names the rollout ids the Gym saw.
    const ids = async (out: string) => (await readFile(join(w.root, out), "utf8")).split("\n").filter(Boolean).map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id).sort();
    expect(await ids("results-1.jsonl")).toEqual(["run1.q1", "run1.row-2"]);
    expect(await ids("results-2.jsonl")).toEqual(["run2.q1", "run2.row-2"]);
  }, 120_000);

  it("without it, the second run's first call continued the first run's lineage (the defect it avoids)", async () => {
    world = await startGymWorld({ base: await (base ??= startGymBase()) });
    const w = world;
    await writeFile(join(w.root, "tasks.jsonl"), `${JSON.stringify({ id: "q1", task: { expression: "17 + 25", tool_rounds: 1 } })}\n`);
    expect(await collect(w, "results-1.jsonl", [])).toBe(0);
    await rm(join(w.root, "dispatched.jsonl"));
    expect(await collect(w, "results-2.jsonl", [])).toBe(0);
    const rows = (await ledgers(w)).get("q1")!;
    // Documented (docs/collect.md, "Rollout ids across collections"): one key, both runs' rows, one chain.
    expect(rows).toHaveLength(4);
    expect(rows[2]!.parent_call_id).toBe(rows[1]!.model_call_id);
  }, 120_000);
});
