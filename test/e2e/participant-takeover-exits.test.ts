import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ScriptableKind, type ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import type { Kind } from "../../protocol/index.js";
import { controlRequest, nobodyAnswers as nobodyAnswersName } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { killAll, TrackedProcesses } from "../support/process-tree.js";
import { startStallProxy, type StallProxy } from "../support/stall-proxy.js";
import { waitUntil } from "../support/wait-until.js";

// A participant program cut off from NATS while a restart took its name over must not serve on
// beside it once back: it shuts down and exits 1 with instance_conflict, as the same conflict at
// start-up does (docs/operations.md), for its supervisor to report.
const DEPLOYMENT = `takeover${process.pid}`;
const TOKEN = "t0ken";
let nats: NatsFixture;
const seen = new TrackedProcesses();
const proxies: StallProxy[] = [];
const handles: ParticipantHandle<ScriptRecord>[] = [];

beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  killAll(seen);
  await Promise.allSettled(handles.map((h) => h.stop()));
  await Promise.allSettled(proxies.map((p) => p.close()));
  await nats?.close();
});

const nobodyAnswers = (kind: Kind, instance: string) => nobodyAnswersName(nats.nc, DEPLOYMENT, kind, instance);

function exitOf(child: ChildProcess): Promise<number | null> {
  return new Promise((resolve) => child.once("exit", (code) => resolve(code)));
}

const programs: { name: string; kind: Kind; entry: string; args: string[] }[] = [
  { name: "a reference Gym server", kind: "resources", entry: "dist/participants/gym/resources-server/main.js", args: [] },
  { name: "the attach proxy", kind: "model", entry: "dist/participants/attach/main.js", args: ["--upstream", "http://127.0.0.1:9/v1"] },
];

describe("a participant program whose name another process took over while it was cut off from NATS", () => {
  for (const program of programs) {
    it(`${program.name} stops serving and exits 1 with instance_conflict; the new process serves on`, async () => {
      const instance = `${program.kind}-twin`;
      const proxy = await startStallProxy(nats.server.port);
      proxies.push(proxy);
      const child = spawn(process.execPath, [program.entry, ...program.args, "--nats", proxy.url, "--deployment", DEPLOYMENT, "--instance", instance, "--token", TOKEN], {
        stdio: ["ignore", "pipe", "pipe"],
      });
      seen.add(child.pid!);
      const exited = exitOf(child);
      let stdout = "";
      let stderr = "";
      child.stderr!.on("data", (chunk) => (stderr += String(chunk)));
      const ready = new Promise<void>((resolve, reject) => {
        createInterface({ input: child.stdout! }).on("line", (line) => {
          stdout += `${line}\n`;
          if (line.includes('"ready":true')) resolve();
        });
        void exited.then((code) => reject(new Error(`${program.entry} exited early (${code}): ${stderr}`)));
      });
      await ready;

      proxy.cut();
      await waitUntil(() => nobodyAnswers(program.kind, instance), "the program's subscriptions gone from the server");
      const next = await startParticipant({ nc: nats.nc, deployment: DEPLOYMENT, instance, token: TOKEN, adapter: new ScriptableKind(program.kind) });
      handles.push(next);
      proxy.heal();

      await waitUntil(() => child.exitCode !== null, "the program exiting by itself");
      expect(await exited).toBe(1);
      expect(stderr).toMatch(/: instance_conflict: another process \(incarnation [0-9a-f]+, started .*\) took over/);
      expect(stderr).not.toMatch(/^\s+at /m);
      expect(stdout).toContain('"code":"instance_conflict"');
      // The new process kept its entry and answers alone.
      expect(await controlRequest(nats.nc, { deployment: DEPLOYMENT, kind: program.kind, instance, token: TOKEN }, "status", {})).toMatchObject({ instance, phase: "idle" });
      await next.stop();
      expect(await nobodyAnswers(program.kind, instance)).toBe(true);
    }, 60_000);
  }
});
