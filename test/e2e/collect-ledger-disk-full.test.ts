import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { join } from "node:path";
import { collectHarness } from "./collect-processes.js";
import { canMountTmpfs, mountSmallDisk, type SmallDisk } from "../support/tmpfs-mount.js";

/**
 * `gym-ckpt collect` against the reference Gym whose model proxy keeps its capture ledger on a
 * real 2 MiB tmpfs that fills mid-run: the calls whose rows cannot be written are cut off (the
 * agent sends them again), later calls are refused `storage_error` before they reach the policy
 * backend, `/run` passes that on, and the collector waits: no row spends an attempt on the outage,
 * so with `--max-attempts 1` the collection still finishes every row, none failed, once there is
 * room again. Skipped where a tmpfs cannot be mounted.
 */
const { setUp, startCollector } = collectHarness();
let disk: SmallDisk | undefined;

beforeAll(() => {
  if (canMountTmpfs) disk = mountSmallDisk("gym-ckpt-ledger-full", "2m");
});
afterAll(() => disk?.remove());

describe.skipIf(!canMountTmpfs)("collect while the model proxy's ledger disk is full (real tmpfs; needs mount rights)", () => {
  it("refuses calls before the backend while the disk is full, spends no attempt on it, and finishes every row once there is room", async () => {
    const rows = 8;
    const w = await setUp(rows, { rounds: 2, modelArgs: ["--ledger-dir", join(disk!.dir, "ledger")] });
    // Each row's second policy call is held at the backend while the disk fills under it.
    await w.backend.hold(2);
    const output: string[] = [];
    const first = await startCollector(w, ["--concurrency", "2", "--max-attempts", "1", "--run-timeout-s", "120"], output);
    await w.waitFor(async () => (await w.backend.calls()).length >= 4, "both rows' second calls held");
    disk!.fill(0);
    await w.backend.release();
    // The held calls append to their keys' files, whose last pages may have room; the first call of
    // a new attempt needs a new file, which the full disk refuses: that call is cut, and later ones refused.
    await w.waitFor(() => output.some((l) => l.includes("/run answered storage_error")), "the collector to see storage_error", 30_000);
    const before = (await w.backend.calls()).length;
    const refused = await fetch(`${w.gym.urls.model!}/ng-rollout/probe-row/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "policy", messages: [{ role: "user", content: "1 + 1" }] }),
    });
    expect(refused.status).toBe(507);
    expect(((await refused.json()) as { error: { code: string; detail: string } }).error).toMatchObject({ code: "storage_error", detail: expect.stringContaining("ENOSPC") });
    // Refused at the proxy: the backend generated nothing for it.
    expect((await w.backend.calls()).length).toBe(before);
    disk!.free();
    const exited = await Promise.race([first.exited, new Promise((r) => setTimeout(() => r("hung"), 60_000))]);
    expect(exited, output.join("\n")).toEqual({ code: 0, signal: null });
    expect(output.some((l) => l.startsWith(`rows: ${rows} (finished ${rows}, failed 0)`)), output.join("\n")).toBe(true);
  }, 120_000);
});
