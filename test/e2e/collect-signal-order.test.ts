import { readFile, readdir } from "node:fs/promises";
import { join } from "node:path";
import type { Msg } from "@nats-io/transport-node";
import { describe, expect, it } from "vitest";
import type { GymWorld } from "../support/gym-processes.js";
import { collectHarness } from "./collect-processes.js";

/**
 * `gym-ckpt collect` given signals at awkward moments: which one wins, and which exit code it ends
 * with. The collector reaches the coordinator through a relay that forwards every op but can keep
 * one back (the first of its name) until the test lets it go, holding the collector there.
 */
const { setUp, startCollector, resultLines, stopAndRequeue } = collectHarness();

async function delayingRelay(w: GymWorld, delayed: string) {
  const nc = await w.nats.connect();
  const ops: string[] = [];
  let held: Msg | undefined;
  let heldOnce = false;
  let onHeld: (() => void) | undefined;
  const isHeld = new Promise<void>((resolve) => (onHeld = resolve));
  const forward = (msg: Msg, op: string) =>
    void nc.request(`gym.ckpt.v1.${w.deployment}.ctl.${op}`, msg.data, { timeout: 120_000, ...(msg.headers && { headers: msg.headers }) }).then(
      (reply) => msg.respond(reply.data, reply.headers ? { headers: reply.headers } : undefined),
      () => undefined,
    );
  nc.subscribe(`gym.ckpt.v1.${w.deployment}-relay.ctl.*`, {
    callback: (_err, msg) => {
      const op = msg.subject.split(".").pop()!;
      ops.push(op);
      if (op !== delayed || heldOnce) return forward(msg, op);
      heldOnce = true;
      held = msg;
      onHeld!();
    },
  });
  return {
    deployment: `${w.deployment}-relay`,
    ops,
    /** Resolves once the delayed op arrived (and is kept). */
    isHeld,
    release: () => held && forward(held, delayed),
  };
}

describe("collect: signal order", () => {
  it("a SIGUSR1 and a SIGTERM both during start-up: only the stop checkpoint runs, exit 75", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    await w.backend.hold(0);
    const relay = await delayingRelay(w, "status"); // start-up's first op: the lock is held by then
    const out: string[] = [];
    const collector = await startCollector(w, ["--deployment", relay.deployment], out);
    await relay.isHeld;
    collector.child.kill("SIGUSR1");
    collector.child.kill("SIGTERM");
    await w.waitFor(() => out.includes("SIGTERM: the stop checkpoint follows once the start has ended"), "the SIGTERM heard");
    relay.release();
    expect(await collector.exited, out.join("\n")).toEqual({ code: 75, signal: null });
    expect(relay.ops.filter((op) => op === "prepare")).toHaveLength(1);
    expect(relay.ops.filter((op) => op === "resume")).toHaveLength(0); // the stop's checkpoint stays open for the restore
    await w.backend.release();
  });

  it("a SIGTERM once the collection has ended (its closing forget held): exits with the collection's own code, not 75", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const relay = await delayingRelay(w, "forget"); // sent at close for the failed row's retired attempt
    const out: string[] = [];
    // A /run path the environment does not serve: the row fails for good, so the collection exits 1.
    const collector = await startCollector(w, ["--deployment", relay.deployment, "--run-url", `${w.gym.urls.environment!}/nope`, "--max-attempts", "1"], out);
    await relay.isHeld;
    // Sent until one is answered "SIGTERM again": the first was heard (signals sent at once may merge).
    await w.waitFor(() => out.some((l) => l.includes("SIGTERM again")) || !collector.child.kill("SIGTERM"), "the SIGTERM heard");
    relay.release();
    expect(await collector.exited, out.join("\n")).toEqual({ code: 1, signal: null });
    expect(out.some((l) => l.startsWith("rows: 1 (finished 0, failed 1)")), out.join("\n")).toBe(true);
    expect(out.some((l) => l.includes("exiting 75")), out.join("\n")).toBe(false);
  });

  it("Ctrl-C during a SIGUSR1 checkpoint (its commit held): that checkpoint is resumed before the exit, not left holding the Gym parked until the lease, exit 130", { timeout: 60_000 }, async () => {
    const w = await setUp(2);
    await w.backend.hold(0); // every row stays in flight
    const relay = await delayingRelay(w, "commit");
    const out: string[] = [];
    const collector = await startCollector(w, ["--deployment", relay.deployment, "--checkpoint-timeout-s", "5"], out);
    await w.waitFor(async () => (await w.backend.calls()).length >= 2, "rows running");
    collector.child.kill("SIGUSR1");
    await relay.isHeld; // prepared: admission closed, every participant parked
    collector.child.kill("SIGINT");
    expect(await collector.exited, out.join("\n")).toEqual({ code: 130, signal: null });
    expect(relay.ops).toContain("resume");
    expect((await w.client.status()).checkpoint).toBeNull();
    expect((await w.status("environment")).phase).toBe("idle");
    await w.backend.release();
  });

  it("Ctrl-C while the start's restore runs: the restored checkpoint is resumed before the exit, not left holding the Gym parked until the lease, exit 130", { timeout: 90_000 }, async () => {
    const w = await setUp(3);
    await stopAndRequeue(w, 3); // LATEST continues the rows; fresh Gym processes
    const relay = await delayingRelay(w, "restore");
    const out: string[] = [];
    const collector = await startCollector(w, ["--deployment", relay.deployment], out);
    await relay.isHeld;
    collector.child.kill("SIGINT");
    relay.release(); // the restore lands at the coordinator whether or not the collector still waits for it
    expect(await collector.exited, out.join("\n")).toEqual({ code: 130, signal: null });
    await w.waitFor(async () => (await w.client.status()).checkpoint === null, "the restored checkpoint closed", 10_000);
    expect((await w.status("environment")).phase).toBe("idle");
  });

  it("Ctrl-C during the stop checkpoint (its commit held) still writes the records of the rows --out has, exit 130", { timeout: 60_000 }, async () => {
    const w = await setUp(2);
    await w.backend.hold(2); // r0's two policy calls pass, r1's first is held: r1 stays in flight
    const relay = await delayingRelay(w, "commit");
    const records = join(w.root, "records");
    const out: string[] = [];
    const flags = ["--deployment", relay.deployment, "--concurrency", "1", "--records-dir", records, "--records-every-s", "600"];
    const collector = await startCollector(w, flags, out);
    await w.waitFor(async () => (await resultLines(w)).length === 1, "r0 in --out");
    collector.child.kill("SIGTERM");
    await relay.isHeld;
    collector.child.kill("SIGINT");
    expect(await collector.exited, out.join("\n")).toEqual({ code: 130, signal: null });
    const steps = await readdir(join(records, "rollouts")).catch(() => []);
    const files = await Promise.all(steps.map(async (step) => (await readdir(join(records, "rollouts", step))).map((f) => join(records, "rollouts", step, f))));
    const texts = await Promise.all(files.flat().filter((f) => f.endsWith(".jsonl")).map((f) => readFile(f, "utf8")));
    expect(texts.join("").includes('"r0"'), `records: ${files.flat().join(", ")}`).toBe(true);
    await w.backend.release();
  });
});
