import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { launchGym, type Gym } from "../../participants/gym/gym-launcher.js";
import { CONTROLLER_TOKEN, GYM_SERVERS, GYM_TOKEN } from "../support/gym-processes.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { collectArgs } from "../support/collect-args.js";
import { spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * `gym-ckpt collect` with timer checkpoints while its coordinator daemon is SIGKILLed and started
 * again (alone, or together with the collector and the Gym servers) at moments a seeded generator
 * picks: every row must still finish exactly once. A failure names its seed; CK_SEED=<seed> replays
 * the same kill moments.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));
const ROWS = 12;

let nats: NatsFixture | undefined;
let gym: Gym | undefined;
let root: string | undefined;
const daemons: DaemonProcess[] = [];
const collectors: ChildProgram[] = [];

afterEach(async () => {
  await Promise.allSettled(collectors.splice(0).map((c) => c.kill("SIGKILL")));
  await Promise.allSettled(daemons.splice(0).map((d) => d.kill("SIGKILL")));
  await gym?.stop().catch(() => undefined);
  await nats?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
  gym = nats = root = undefined;
});

/** nats-server, a coordinator daemon (lease 500 ms, so a successor leads soon) and the Gym, with ROWS rows in tasks.jsonl. */
async function setUp(deployment: string): Promise<{ gym: Gym; startDaemon: () => DaemonProcess }> {
  nats = await startNats();
  const checkpointRoot = (root = await mkdtemp(join(tmpdir(), "gym-ckpt-e2e-ck-")));
  const natsUrl = nats.server.url;
  const startDaemon = () => {
    const daemon = spawnDaemon([
      CLI, "coordinator", "--deployment", deployment, "--nats-url", natsUrl, "--token", GYM_TOKEN, "--controller-token", CONTROLLER_TOKEN,
      "--checkpoint-root", checkpointRoot, "--lease-ms", "500", "--default-timeout-ms", "10000", "--no-http", "--log-level", "warn",
    ]);
    daemons.push(daemon);
    return daemon;
  };
  startDaemon();
  gym = await launchGym({
    nats: natsUrl,
    deployment,
    token: GYM_TOKEN,
    checkpointRoot,
    // A participant left parked (a resume lost with a killed coordinator) resumes by its lease, the
    // protocol's way out: short here, so that slow path fits the wait below. The lost resume itself
    // is sent again by the collector (collect-lost-resume.test.ts checks it with the full grace).
    leaseGraceSeconds: 15,
    args: { policy: ["--token-delay-ms", "20"], model: ["--ledger-dir", join(checkpointRoot, "model-ledger")] },
  });
  const lines = Array.from({ length: ROWS }, (_, i) => JSON.stringify({ id: `r${i}`, task: { expression: `${i} + 1`, tool_rounds: 2 } }));
  await writeFile(join(checkpointRoot, "tasks.jsonl"), `${lines.join("\n")}\n`);
  return { gym, startDaemon };
}

async function startCollect(deployment: string, output: string[]): Promise<ChildProgram> {
  const collector = await startChildProgram(
    CLI,
    collectArgs({ natsUrl: nats!.server.url, deployment, token: CONTROLLER_TOKEN, root: root!, runUrl: `${gym!.urls.environment!}/run` }, [
      "--checkpoint-timeout-s", "5", "--checkpoint-every", "0.3",
      "--concurrency", "4", "--leader-wait-ms", "20000", "--log-level", process.env.COLLECT_E2E_VERBOSE ? "info" : "warn",
    ]),
    {
      onLine: (line: string) => {
        output.push(line);
        if (process.env.COLLECT_E2E_VERBOSE) console.log(`[collect] ${line}`);
      },
    },
  );
  collectors.push(collector);
  return collector;
}

/** The kill moments: a seeded generator, so a failing run can be replayed (CK_SEED). */
function killMoments(): { seed: number; between: (min: number, spread: number) => Promise<void>; coin: () => boolean } {
  const seed = Number(process.env.CK_SEED ?? Date.now() % 100_000);
  let s = seed;
  const rand = () => (s = (s * 1103515245 + 12345) % 2147483648) / 2147483648;
  // Not a wait for something to happen: where in the collection the next kill lands.
  const between = (min: number, spread: number) => new Promise<void>((resolve) => setTimeout(resolve, min + rand() * spread));
  return { seed, between, coin: () => rand() < 0.5 };
}

/** Waits for the collector to exit 0 with every row in results.jsonl exactly once. */
async function expectAllRowsOnce(collector: ChildProgram, context: string): Promise<void> {
  const exited = await Promise.race([collector.exited, new Promise((resolve) => setTimeout(() => resolve("still running after 90 s"), 90_000))]);
  expect(exited, context).toEqual({ code: 0, signal: null });
  const text = await readFile(join(root!, "results.jsonl"), "utf8");
  const ids = text.split("\n").filter(Boolean).map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id).sort();
  expect(ids, context).toEqual(Array.from({ length: ROWS }, (_, i) => `r${i}`).sort());
  expect(existsSync(join(root!, "collector.pid"))).toBe(false);
}

describe("collect while its coordinator is SIGKILLed", () => {
  it("the coordinator SIGKILLed and started again mid-collection: every row finishes exactly once, exit 0", { timeout: 120_000 }, async () => {
    const deployment = `ck${process.pid}`;
    const { startDaemon } = await setUp(deployment);
    const out: string[] = [];
    const collector = await startCollect(deployment, out);
    const { seed, between } = killMoments();
    let daemon = daemons[0]!;
    for (let round = 0; round < 2 && collector.child.exitCode === null; round++) {
      await between(300, 1500);
      if (collector.child.exitCode !== null) break;
      await daemon.kill("SIGKILL");
      await between(200, 1500);
      daemon = startDaemon();
    }
    await expectAllRowsOnce(collector, `seed ${seed}\n${out.join("\n")}`);
  });

  it("coordinator, collector and Gym servers SIGKILLed together: started again, every row finishes exactly once", { timeout: 120_000 }, async () => {
    const deployment = `ck${process.pid}b`;
    const { gym: g, startDaemon } = await setUp(deployment);
    const { seed, between, coin } = killMoments();
    const history: string[] = [];
    let daemon = daemons[0]!;
    for (let round = 0; round < 3; round++) {
      const out: string[] = [];
      const collector = await startCollect(deployment, out);
      await between(400, 2000);
      if (collector.child.exitCode !== null) {
        history.push(`round ${round}: ended ${collector.child.exitCode} ${out.slice(-3).join(" | ")}`);
        break;
      }
      const coordinatorFirst = coin();
      if (coordinatorFirst) {
        await daemon.kill("SIGKILL");
        await collector.kill("SIGKILL");
      } else {
        await collector.kill("SIGKILL");
        await daemon.kill("SIGKILL");
      }
      const gymToo = coin();
      if (gymToo) {
        await g.kill(GYM_SERVERS, "SIGKILL");
        await g.start(GYM_SERVERS);
      }
      history.push(`round ${round}: ${coordinatorFirst ? "coordinator" : "collector"} killed first, Gym servers ${gymToo ? "too" : "kept"}`);
      daemon = startDaemon();
    }
    const out: string[] = [];
    const last = await startCollect(deployment, out);
    await expectAllRowsOnce(last, `seed ${seed}\n${history.join("\n")}\n${out.join("\n")}`);
  });
});
