import { describe, it } from "vitest";
import { startControllerRelay, type RelayAction } from "../support/controller-relay.js";
import { collectHarness } from "./collect-processes.js";

/**
 * `gym-ckpt collect` SIGKILLed at each controller op of the restore after a requeue, with or without
 * a Gym restart: the next start always finishes every row once (collect-kill-points.test.ts has the
 * checkpoint's ops).
 */
const { setUp, startCollector, finishCleanly, stopAndRequeue } = collectHarness();

describe("collect SIGKILLed at a chosen controller op of the restore after a requeue", () => {
  const cases: { name: string; op: string; action: RelayAction; restartGym: boolean }[] = [
    { name: "restore held", op: "restore", action: "hold", restartGym: false },
    { name: "restore done, reply lost", op: "restore", action: "drop-reply", restartGym: false },
    { name: "restore done, reply lost, Gym restarted again", op: "restore", action: "drop-reply", restartGym: true },
    { name: "resume of the restore held", op: "resume", action: "hold", restartGym: false },
    { name: "resume of the restore done, reply lost", op: "resume", action: "drop-reply", restartGym: false },
    { name: "resume of the restore done, reply lost, Gym restarted again", op: "resume", action: "drop-reply", restartGym: true },
  ];
  it.each(cases)("$name", { timeout: 60_000 }, async ({ op, action, restartGym }) => {
    const rows = 3;
    const w = await setUp(rows);
    await stopAndRequeue(w, rows);
    const relay = await startControllerRelay(w, (o, n) => (o === op && n === 1 ? action : "pass"));
    const collector = await startCollector(w, ["--deployment", relay.deployment]);
    await Promise.race([relay.when((o, a) => (action === "hold" ? o === op && a === "hold" : o === `${op}:done`)), collector.exited]);
    await collector.kill("SIGKILL");
    await relay.close();
    if (restartGym) await w.crashAndRestart();
    await finishCleanly(w, rows);
  });
});
