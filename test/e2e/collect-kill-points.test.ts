import { describe, expect, it } from "vitest";
import { startControllerRelay, type RelayAction } from "../support/controller-relay.js";
import { collectHarness } from "./collect-processes.js";

/**
 * `gym-ckpt collect` killed at every awkward moment (SIGTERM with the Gym kept, random SIGKILLs,
 * a SIGKILL at each controller op of a checkpoint), with or without a Gym restart: the next start
 * always finishes every row once. The restore's ops: collect-kill-points-restore.test.ts (a file
 * of its own, so the two halves run on both test workers).
 */
const { setUp, startCollector, finishCleanly, resultLines } = collectHarness();

describe("collect restarted after a stop", () => {
  it("SIGTERM, then a restart against the same (parked) Gym servers finishes every row once", { timeout: 60_000 }, async () => {
    const w = await setUp(3);
    await w.backend.hold(1);
    const first = await startCollector(w);
    await w.waitFor(async () => (await w.backend.calls()).length >= 4, "rows running");
    first.child.kill("SIGTERM");
    expect((await first.exited).code).toBe(75);
    await w.backend.release();
    await finishCleanly(w, 3);
    expect((await resultLines(w)).map((l) => l.rollout_id).sort()).toEqual(["r0", "r1", "r2"]);
  });
});

describe("collect killed at random moments", () => {
  it("SIGKILL at random moments, restarts (Gym restarted or not): every row once, no torn line, right summary", { timeout: 60_000 }, async () => {
    const n = 12;
    const w = await setUp(n, { rounds: 2, policyArgs: ["--token-delay-ms", "20"] });
    const seed = Number(process.env.COLLECT_KILL_SEED ?? Date.now() % 100000);
    let s = seed;
    const rand = () => (s = (s * 1103515245 + 12345) % 2147483648) / 2147483648;
    const flags = ["--concurrency", "4", "--checkpoint-every", "0.3"];
    for (let round = 0; round < 4; round++) {
      const out: string[] = [];
      const collector = await startCollector(w, flags, out);
      const wait = 200 + rand() * 2000;
      const ended = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r(undefined), wait))]);
      if (ended) break;
      await collector.kill("SIGKILL");
      if (rand() < 0.5) await w.crashAndRestart();
    }
    await finishCleanly(w, n, flags).catch((error: unknown) => {
      throw new Error(`seed ${seed} (COLLECT_KILL_SEED replays it): ${String(error)}`);
    });
  });
});

describe("collect SIGKILLed at a chosen controller op of a checkpoint", () => {
  const cases: { name: string; op: string; action: RelayAction; restartGym: boolean }[] = [
    { name: "after prepare (commit held)", op: "commit", action: "hold", restartGym: false },
    { name: "after commit (publish held)", op: "publish", action: "hold", restartGym: false },
    { name: "after publish (resume held), Gym kept", op: "resume", action: "hold", restartGym: false },
    { name: "after publish (resume held), Gym restarted", op: "resume", action: "hold", restartGym: true },
    { name: "publish done at the coordinator, reply lost, Gym kept", op: "publish", action: "drop-reply", restartGym: false },
    { name: "publish done at the coordinator, reply lost, Gym restarted", op: "publish", action: "drop-reply", restartGym: true },
  ];
  it.each(cases)("$name", { timeout: 60_000 }, async ({ op, action, restartGym }) => {
    const w = await setUp(3);
    await w.backend.hold(1);
    const relay = await startControllerRelay(w, (o, n) => (o === op && n === 1 ? action : "pass"));
    const collector = await startCollector(w, ["--deployment", relay.deployment]);
    await w.waitFor(async () => (await w.backend.calls()).length >= 4, "rows running");
    const reached = relay.when((o, a) => (action === "hold" ? o === op && a === "hold" : o === `${op}:done`));
    collector.child.kill("SIGUSR1");
    await reached;
    await collector.kill("SIGKILL");
    await relay.close();
    if (restartGym) await w.crashAndRestart();
    await w.backend.release();
    await finishCleanly(w, 3);
  });
});
