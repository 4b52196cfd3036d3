import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Msg } from "@nats-io/transport-node";
import { afterEach, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { controllerSubject } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { collectArgs } from "../support/collect-args.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * A SIGTERM while `gym-ckpt collect` starts, and the start then fails: nothing was checkpointed,
 * so the exit reports the start's failure (its code, exit 1), not 75 ("checkpointed, requeue me").
 * The coordinator is a NATS responder that holds the collector's first `status` until told.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));

let nats: NatsFixture | undefined;
let root: string | undefined;
let collector: ChildProgram | undefined;
afterEach(async () => {
  await collector?.kill("SIGKILL").catch(() => undefined);
  await nats?.close();
  if (root) await rm(root, { recursive: true, force: true });
  collector = nats = root = undefined;
});

describe("collect: SIGTERM during a start that fails", () => {
  it("exits with the start failure's code and status (error unauthorized, exit 1), not 75", { timeout: 30_000 }, async () => {
    nats = await startNats();
    root = await mkdtemp(join(tmpdir(), "gym-ckpt-e2e-sigterm-start-"));
    await writeFile(join(root, "tasks.jsonl"), `${JSON.stringify({ id: "r0", task: {} })}\n`);
    const deployment = "sigterm-start";
    let held: Msg | undefined;
    const statusAsked = new Promise<void>((resolve) =>
      nats!.nc.subscribe(controllerSubject(deployment, "status"), {
        callback: (_err, msg) => {
          held = msg;
          resolve();
        },
      }),
    );
    await nats.nc.flush();
    const out: string[] = [];
    collector = await startChildProgram(
      CLI,
      collectArgs({ natsUrl: nats.server.url, deployment, token: "controller-token", root, runUrl: "http://127.0.0.1:2/run" }),
      { onLine: (line) => out.push(line) },
    );
    await statusAsked;
    collector.child.kill("SIGTERM");
    // The signal is handled (the process is still there) before the start's refusal arrives.
    await waitUntil(() => out.includes("SIGTERM: the stop checkpoint follows once the start has ended"), `the SIGTERM line, got ${out.join("\n")}`);
    expect(collector.child.exitCode).toBeNull();
    held!.respond(JSON.stringify({ error: { code: "unauthorized", detail: "bad controller token" } }));
    expect(await collector.exited, out.join("\n")).toEqual({ code: 1, signal: null });
    expect(out.some((l) => l.startsWith("error unauthorized: bad controller token")), out.join("\n")).toBe(true);
    expect(out.some((l) => l.includes("exiting 75")), out.join("\n")).toBe(false);
    expect(existsSync(join(root, "collector.pid"))).toBe(false);
  });
});
