import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";

/** `gym-ckpt gym` over the built CLI: the whole reference set starts, serves a rollout, and stops cleanly. */
let nats: NatsFixture;
let child: ChildProcess | undefined;

beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  if (child && child.exitCode === null) child.kill("SIGKILL");
  await nats?.close();
});

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("gym-ckpt gym", () => {
  it("starts every reference server, runs an episode, and stops them all on SIGTERM", async () => {
    child = spawn(process.execPath, ["dist/coordinator/cli/main.js", "gym", "--nats", nats.server.url, "--deployment", "launcher", "--token", "t0ken"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    const ready = await new Promise<any>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no ready line")), 30_000);
      createInterface({ input: child!.stdout! }).on("line", (line) => {
        if (!line.startsWith("{")) return;
        const parsed = JSON.parse(line);
        if (parsed.ready && parsed.name === "gym") {
          clearTimeout(timer);
          resolve(parsed);
        }
      });
      child!.once("exit", (code) => reject(new Error(`gym exited early (${code})`)));
    });
    expect(Object.keys(ready.urls).sort()).toEqual(["agent", "environment", "model", "policy", "resources"]);
    for (const url of Object.values(ready.urls) as string[]) expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const response = await fetch(`${ready.urls.environment}/run`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rollout_id: "demo-1", attempt: 0, task: { expression: "6 * 7", tool_rounds: 1 } }),
    });
    expect(await response.json()).toEqual({ rollout_id: "demo-1", attempt: 0, reward: 1, answer: "42", continued_from: null });
    const ports = Object.values(ready.urls) as string[];
    const exited = new Promise<number | null>((resolve) => child!.once("exit", (code) => resolve(code)));
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    // Every child is gone: nothing answers on any of the URLs any more.
    for (const url of ports) await expect(fetch(`${url}/health`)).rejects.toThrow();
    expect(alive(child.pid!)).toBe(false);
  });

  it("refuses to start without a control token", async () => {
    const bare = spawn(process.execPath, ["dist/coordinator/cli/main.js", "gym", "--nats", nats.server.url], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, GYM_CKPT_TOKEN: "" } });
    let stderr = "";
    bare.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    const code = await new Promise<number | null>((resolve) => bare.once("exit", resolve));
    expect(code).toBe(2);
    expect(stderr).toContain("control token is required");
  });
});
