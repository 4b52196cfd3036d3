import { spawn } from "node:child_process";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { memberKey, membersBucket, type Kind } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { killAll, TrackedProcesses } from "../support/process-tree.js";

// A supervisor may stop a participant program while it is still starting (systemd's stop of a
// unit that just restarted, a deploy rolling over). SIGTERM then is a clean shutdown like any
// other: exit 0, no error line, and no membership entry left announcing a process that is gone
// (a checkpoint opened within the entry's TTL would count it unreachable).
const DEPLOYMENT = `startstop${process.pid}`;
let nats: NatsFixture;
const seen = new TrackedProcesses();

beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  killAll(seen);
  await nats?.close();
});

const programs: { name: string; kind: Kind; entry: string; args: string[] }[] = [
  { name: "a reference Gym server", kind: "resources", entry: "dist/participants/gym/resources-server/main.js", args: [] },
  { name: "the attach proxy", kind: "model", entry: "dist/participants/attach/main.js", args: ["--upstream", "http://127.0.0.1:9/v1"] },
];

/**
 * Starts `program` and sends it SIGTERM the moment its start-up sends its first message on
 * `subject` (a plain subscriber sees it beside whoever answers), so the signal lands mid start-up.
 */
async function signalDuringStart(program: (typeof programs)[number], instance: string, subject: string) {
  const child = spawn(process.execPath, [program.entry, ...program.args, "--nats", nats.server.url, "--deployment", DEPLOYMENT, "--instance", instance, "--token", "t0ken"], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  seen.add(child.pid!);
  let stdout = "";
  let stderr = "";
  child.stdout!.on("data", (chunk) => (stdout += String(chunk)));
  child.stderr!.on("data", (chunk) => (stderr += String(chunk)));
  const signalled = { sent: false };
  const sub = nats.nc.subscribe(subject, {
    callback: () => {
      if (signalled.sent) return;
      signalled.sent = true;
      child.kill("SIGTERM");
    },
  });
  await nats.nc.flush();
  const code = await new Promise<number | null>((resolve) => child.once("exit", (exitCode) => resolve(exitCode)));
  sub.unsubscribe();
  const kv = await new Kvm(nats.nc).open(membersBucket(DEPLOYMENT));
  const entry = await kv.get(memberKey(program.kind, instance));
  return { code, stdout, stderr, signalled: signalled.sent, announced: entry?.operation === "PUT" };
}

describe("SIGTERM while a participant program starts", () => {
  for (const program of programs) {
    it(`${program.name}: while it opens the membership registry, exits 0 without an error line and leaves no entry`, async () => {
      const instance = `${program.kind}-kv`;
      const outcome = await signalDuringStart(program, instance, `$JS.API.STREAM.INFO.KV_${membersBucket(DEPLOYMENT)}`);
      expect({ signalled: outcome.signalled, code: outcome.code, stderr: outcome.stderr, announced: outcome.announced }).toEqual({ signalled: true, code: 0, stderr: "", announced: false });
      expect(outcome.stdout).toContain('"signal":"SIGTERM"');
    }, 30_000);

    it(`${program.name}: while it writes its membership entry, exits 0 without an error line and leaves no entry`, async () => {
      const instance = `${program.kind}-put`;
      const outcome = await signalDuringStart(program, instance, `$KV.${membersBucket(DEPLOYMENT)}.${memberKey(program.kind, instance)}`);
      expect({ signalled: outcome.signalled, code: outcome.code, stderr: outcome.stderr, announced: outcome.announced }).toEqual({ signalled: true, code: 0, stderr: "", announced: false });
    }, 30_000);
  }
});
