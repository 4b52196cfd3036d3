import { describe, expect, it } from "vitest";
import { PACKAGE_VERSION } from "../../protocol/index.js";
import { collectHarness } from "./collect-processes.js";

/**
 * `gym-ckpt collect`'s first log line says which build collects what, where: before, a collector
 * killed in its first seconds (the chaos harness's `kill-collector@1.3s`) left no line at all.
 */
const { setUp, startCollector } = collectHarness();

describe("collect's start line", () => {
  it("names its version, deployment, NATS server, --run-url (without its query), checkpoint dir and rows", { timeout: 60_000 }, async () => {
    const w = await setUp(2);
    const out: string[] = [];
    const collector = await startCollector(w, ["--log-level", "info"], out);
    expect(await collector.exited, out.join("\n")).toEqual({ code: 0, signal: null });
    const started = out.filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l["msg"] === "collect started");
    expect(started, out.join("\n")).toMatchObject({
      level: 30,
      version: PACKAGE_VERSION,
      deployment: w.deployment,
      controller: new URL(w.nats.server.url).host,
      run_url: `${w.gym.urls.environment!}/run`,
      checkpoint_dir: w.root,
      rows: 2,
    });
  });
});
