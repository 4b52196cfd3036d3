import { mkdtemp, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import type { NatsConnection } from "@nats-io/transport-node";
import { startParticipant } from "../../../participants/control-plane/start-participant.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { nodeCaseProbeFs, refuseCaseFoldingCheckpointRoot, type CaseProbeFs } from "../../../participants/storage/case-folding-dir.js";

// A participant's records go to `<root>/<checkpoint_id>/gym/<kind>/<instance>`: where the storage
// folds case, instances `Env1` and `env1` (or checkpoint ids differing only in case) share one
// directory. Linux here is case-sensitive: the folding answer is injected.
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-participant-root-case-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

const folding: CaseProbeFs = {
  ...nodeCaseProbeFs,
  exists: async (path) => {
    const wanted = path.slice(path.lastIndexOf("/") + 1).toLowerCase();
    return (await readdir(join(path, ".."))).some((name) => name.toLowerCase() === wanted);
  },
};

it("a participant's checkpoint root on a case-insensitive filesystem is refused storage_error naming it", async () => {
  await expect(refuseCaseFoldingCheckpointRoot(root, folding)).rejects.toMatchObject({
    code: "storage_error",
    message: expect.stringContaining(`checkpoint root ${root} is on a case-insensitive filesystem`),
  });
  expect(await readdir(root)).toEqual([]);
});

it("a case-sensitive root passes; a root not made yet (the coordinator makes it) is not probed; stale probe files there go", async () => {
  const old = new Date(Date.now() - 120_000);
  await writeFile(join(root, ".case-probe.999999999.0123456789ab"), "");
  await utimes(join(root, ".case-probe.999999999.0123456789ab"), old, old);
  await expect(refuseCaseFoldingCheckpointRoot(root)).resolves.toBeUndefined();
  expect(await readdir(root)).toEqual([]);
  await expect(refuseCaseFoldingCheckpointRoot(join(root, "missing"), folding)).resolves.toBeUndefined();
});

it("startParticipant probes its checkpointRoot before it touches NATS", async () => {
  // A root that is a regular file fails the probe's listing: the start stops there, NATS untouched.
  const file = join(root, "not-a-dir");
  await writeFile(file, "");
  const touched: string[] = [];
  const nc = new Proxy({}, { get: (_target, name) => (touched.push(String(name)), () => Promise.reject(new Error("no NATS here"))) }) as unknown as NatsConnection;
  await expect(startParticipant({ nc, deployment: "default", token: "tok", instance: "env0", adapter: new ScriptableKind("environment"), checkpointRoot: file, announce: false })).rejects.toMatchObject({ code: "ENOTDIR" });
  expect(touched).toEqual([]);
});

it("a root this process may not create a probe file in is not probed: its start goes on (it writes only below <root>/<id>/)", async () => {
  // /proc: listed, but no file can be made there (as a root a participant may only read).
  await expect(refuseCaseFoldingCheckpointRoot("/proc")).resolves.toBeUndefined();
  const refusing: CaseProbeFs = { ...nodeCaseProbeFs, create: async () => Promise.reject(Object.assign(new Error("EACCES: permission denied"), { code: "EACCES" })) };
  await expect(refuseCaseFoldingCheckpointRoot(root, refusing)).resolves.toBeUndefined();
});
