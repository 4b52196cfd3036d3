import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, afterEach, expect } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { startControllerRelay, type RelayAction } from "../support/controller-relay.js";
import { collectArgs } from "../support/collect-args.js";
import { CONTROLLER_TOKEN, startGymBase, startGymWorld, type GymBase, type GymWorld } from "../support/gym-processes.js";

/**
 * `gym-ckpt collect` as a real process against the Gym world, for the e2e files that kill it at
 * chosen moments. `collectHarness()` registers the tear-down of everything it starts.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

export interface CollectResult {
  rollout_id: string;
  attempt: number;
  reward: number;
  continued: boolean;
}

export function collectHarness() {
  let world: GymWorld | undefined;
  const collectors: ChildProgram[] = [];

  /** The file's nats-server and policy backend, started by the first world that can share them. */
  let base: Promise<GymBase> | undefined;

  afterEach(async () => {
    await Promise.allSettled(collectors.splice(0).map((c) => c.kill("SIGKILL")));
    await world?.close();
    world = undefined;
  });
  afterAll(async () => {
    await (await base?.catch(() => undefined))?.close();
  });

  /**
   * A Gym world with `n` rows r0…r(n-1) in tasks.jsonl (a policy with `policyArgs` is its own, not
   * the file's shared one; `modelArgs` go to the model attach proxy).
   */
  async function setUp(n: number, { rounds = 1, policyArgs, modelArgs }: { rounds?: number; policyArgs?: string[]; modelArgs?: string[] } = {}): Promise<GymWorld> {
    const model = modelArgs && { model: modelArgs };
    world = await startGymWorld(policyArgs ? { args: { policy: policyArgs, ...model } } : { base: await (base ??= startGymBase()), ...(model && { args: model }) });
    const lines = Array.from({ length: n }, (_, i) => JSON.stringify({ id: `r${i}`, task: { expression: `${i} + 1`, tool_rounds: rounds } }));
    await writeFile(join(world.root, "tasks.jsonl"), `${lines.join("\n")}\n`);
    return world;
  }

  async function startCollector(w: GymWorld, extra: string[] = [], output: string[] = [], env?: NodeJS.ProcessEnv): Promise<ChildProgram> {
    const collector = await startChildProgram(
      CLI,
      collectArgs({ natsUrl: w.nats.server.url, deployment: w.deployment, token: CONTROLLER_TOKEN, root: w.root, runUrl: `${w.gym.urls.environment!}/run` }, [
        "--checkpoint-timeout-s", "15",
        "--log-level", process.env.COLLECT_E2E_VERBOSE ? "info" : "warn",
        ...extra,
      ]),
      {
        onLine: (line: string) => {
          output.push(line);
          if (process.env.COLLECT_E2E_VERBOSE) console.log(`[collect] ${line}`);
        },
        ...(env && { env }),
      },
    );
    collectors.push(collector);
    return collector;
  }

  /** Starts a collector that must finish all `n` rows once, exit 0 and leave no lock; returns its output. */
  async function finishCleanly(w: GymWorld, n: number, extra: string[] = []): Promise<string[]> {
    const out: string[] = [];
    const last = await startCollector(w, extra, out);
    const exited = await Promise.race([last.exited, new Promise((r) => setTimeout(() => r("hung"), 45_000))]);
    expect(exited, out.join("\n")).toEqual({ code: 0, signal: null });
    const text = await readFile(join(w.root, "results.jsonl"), "utf8");
    expect(text.endsWith("\n")).toBe(true);
    const ids = text.split("\n").filter(Boolean).map((l) => (JSON.parse(l) as CollectResult).rollout_id).sort();
    expect(ids).toEqual(Array.from({ length: n }, (_, i) => `r${i}`).sort());
    expect(out.some((l) => l.startsWith(`rows: ${n} (finished ${n}, failed 0)`)), out.join("\n")).toBe(true);
    expect(existsSync(join(w.root, "collector.pid"))).toBe(false);
    return out;
  }

  /** SIGTERM with every row in flight (exit 75), then fresh Gym processes (the policy backend survives). */
  async function stopAndRequeue(w: GymWorld, rows: number): Promise<void> {
    await w.backend.hold(1);
    const first = await startCollector(w);
    await w.waitFor(async () => (await w.backend.calls()).length >= rows + 1, "rows running");
    first.child.kill("SIGTERM");
    expect((await first.exited).code).toBe(75);
    await w.crashAndRestart();
    await w.backend.release();
  }

  /**
   * Starts a collector through a relay and SIGKILLs it once the first `op` was held, or done at the
   * coordinator with its reply dropped; `signalFirst` is sent once rows run (SIGUSR1: a checkpoint).
   */
  async function killAt(w: GymWorld, op: string, action: RelayAction, signalFirst?: NodeJS.Signals): Promise<void> {
    const relay = await startControllerRelay(w, (o, n) => (o === op && n === 1 ? action : "pass"));
    const collector = await startCollector(w, ["--deployment", relay.deployment]);
    const reached = relay.when((o, a) => (action === "hold" ? o === op && a === "hold" : o === `${op}:done`));
    if (signalFirst) {
      await w.waitFor(async () => (await w.backend.calls()).length >= 4, "rows running");
      collector.child.kill(signalFirst);
    }
    await reached;
    await collector.kill("SIGKILL");
    await relay.close();
  }

  async function resultLines(w: GymWorld): Promise<CollectResult[]> {
    const text = await readFile(join(w.root, "results.jsonl"), "utf8").catch(() => "");
    return text.split("\n").filter(Boolean).map((l) => JSON.parse(l) as CollectResult);
  }

  return { setUp, startCollector, finishCleanly, stopAndRequeue, killAt, resultLines, world: () => world };
}
