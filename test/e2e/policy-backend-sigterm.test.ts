import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { backendAdmin } from "../support/policy-backend-admin.js";
import { killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * The policy backend SIGTERMed while it holds a response (/admin/hold): like every reference server
 * it drains for a bounded time, cuts what is left and says so, instead of waiting for a release
 * that never comes (the process, and its port, kept until a SIGKILL).
 */
let nats: NatsFixture;
const seen = new TrackedProcesses();
beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
});
afterAll(async () => {
  killAll(seen);
  await nats?.close();
});

describe("policy backend SIGTERMed with a held response", () => {
  it("exits 0 within the drain, and logs the call it cut", async () => {
    const child: ChildProcess = spawn(process.execPath, ["dist/participants/gym/policy-backend/main.js", "--nats", nats.server.url, "--deployment", "held-sigterm", "--token", "t0ken"], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    seen.add(child.pid!);
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const logs: string[] = [];
    const url = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on("line", (line) => {
        logs.push(line);
        if (line.includes('"ready":true')) resolve((JSON.parse(line) as { url: string }).url);
      });
      void exited.then((code) => reject(new Error(`policy backend exited early (${code})`)));
    });
    await backendAdmin(url, "/admin/hold", {});
    const call = fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "1 + 1" }] }),
    }).then(
      (response) => response.text().then(() => "answered"),
      () => "cut",
    );
    await waitUntil(async () => (await backendAdmin(url, "/admin/calls")).calls.length === 1, "the call to be held");
    const started = Date.now();
    child.kill("SIGTERM");
    const code = await Promise.race([exited, new Promise<string>((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
    if (code === "still running") child.kill("SIGKILL");
    expect(code).toBe(0);
    expect(Date.now() - started).toBeLessThan(8_000);
    expect(await call).toBe("cut");
    const cut = logs.map((line) => JSON.parse(line) as { level?: number; msg?: string; connections?: number }).find((entry) => entry.msg?.includes("cut"));
    expect(cut).toMatchObject({ level: 40, connections: 1 });
  }, 60_000);
});
