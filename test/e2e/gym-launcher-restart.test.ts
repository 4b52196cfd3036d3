import { createServer, type Server } from "node:net";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { launchGym, type Gym } from "../../participants/gym/gym-launcher.js";
import { startNats, type NatsFixture } from "../support/nats.js";

/** launchGym's start(names) after kill(names): the callers of a restarted process keep working. */
let nats: NatsFixture;
let gym: Gym | undefined;
let blocker: Server | undefined;

beforeAll(async () => {
  nats = await startNats();
});
afterEach(async () => {
  await gym?.stop();
  gym = undefined;
  await new Promise<void>((resolve) => (blocker ? blocker.close(() => resolve()) : resolve()));
  blocker = undefined;
});
afterAll(async () => {
  await nats?.close();
});

let rollouts = 0;
async function run(): Promise<{ status: number; body: unknown }> {
  const rollout_id = `restart-${++rollouts}`;
  const response = await fetch(`${gym!.urls.environment}/run`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ rollout_id, attempt: 0, task: { expression: "6 * 7", tool_rounds: 1 } }),
  });
  return { status: response.status, body: await response.json() };
}

const launch = (deployment: string) => launchGym({ nats: nats.server.url, deployment, token: "t0ken", args: { policy: ["--token-delay-ms", "0"] } });

/** Takes `port` on 127.0.0.1 (closed in teardown), as another program would while a process is down. */
async function blockPort(port: number): Promise<void> {
  const b = createServer();
  blocker = b;
  await new Promise<void>((resolve, reject) => {
    b.once("error", reject);
    b.listen(port, "127.0.0.1", () => resolve());
  });
}

describe("restarting part of the Gym", () => {
  it("restarts the agent alone and the environment still reaches it", async () => {
    gym = await launch("restart-agent");
    expect((await run()).status).toBe(200);
    const environmentPid = gym.processes.get("environment")!.pid;
    const agentUrl = gym.urls.agent;
    await gym.kill(["agent"]);
    await gym.start(["agent"]);
    const { status, body } = await run();
    expect({ status, body }).toMatchObject({ status: 200, body: { reward: 1, answer: "42" } });
    expect(gym.urls.agent).toBe(agentUrl);
    // The environment was not touched.
    expect(gym.processes.get("environment")!.pid).toBe(environmentPid);
  });

  it("restarts the model alone and the agent still reaches it", async () => {
    gym = await launch("restart-model");
    expect((await run()).status).toBe(200);
    await gym.kill(["model"]);
    await gym.start(["model"]);
    expect((await run()).status).toBe(200);
  });

  it("moves a process whose port stays taken and restarts its running callers", async () => {
    gym = await launch("restart-moved");
    const agentPort = Number(new URL(gym.urls.agent!).port);
    const environmentPid = gym.processes.get("environment")!.pid;
    await gym.kill(["agent"]);
    await blockPort(agentPort);
    await gym.start(["agent"]);
    expect(Number(new URL(gym.urls.agent!).port)).not.toBe(agentPort);
    expect(gym.processes.get("environment")!.pid).not.toBe(environmentPid);
    expect((await run()).status).toBe(200);
  });

  it("a stop while a restart waits for its taken port ends it: nothing is started after the stop", async () => {
    let portTaken!: () => void;
    const sawTaken = new Promise<void>((resolve) => (portTaken = resolve));
    gym = await launchGym({
      nats: nats.server.url,
      deployment: "restart-stopped",
      token: "t0ken",
      initial: ["policy", "model", "resources", "agent"],
      onOutput: (name, line) => {
        if (name === "agent" && line.includes("EADDRINUSE")) portTaken();
      },
    });
    const agentPort = Number(new URL(gym.urls.agent!).port);
    await gym.kill(["agent"]);
    await blockPort(agentPort);
    const starting = gym.start(["agent"]);
    // Handled from now on: the start may fail while stop() is still ending the other processes,
    // which would otherwise be an unhandled rejection (vitest fails the run on one).
    const ended = starting.then(
      () => "started",
      (error: unknown) => (error instanceof Error ? error.message : String(error)),
    );
    await sawTaken; // the first try failed: the launcher backs off before the next one
    await gym.stop();
    const outcome = await ended;
    // Before: the tries went on after the stop and the agent ended up running on a free port.
    expect({ outcome, running: [...gym.processes.keys()] }).toEqual({ outcome: expect.stringContaining("stopped"), running: [] });
  });
});
