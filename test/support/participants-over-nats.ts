import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll } from "vitest";
import type { Kind, Op } from "../../protocol/index.js";
import { FsCheckpointStorage } from "../../participants/storage/fs-storage.js";
import { WriteGate } from "../../participants/storage/write-gate.js";
import { startParticipant, type ParticipantHandle } from "../../participants/control-plane/start-participant.js";
import type { ParticipantKind } from "../../participants/control-plane/participant-kind.js";
import { controlRequest } from "./control-requests.js";
import { startNats, type NatsFixture } from "./nats.js";

/** Sends one control message to a served participant and answers its reply (or refusal) body. */
export type SendControl = (op: Op, body: unknown) => Promise<any>;

/**
 * In-process participants over one real nats-server per test file, under one checkpoint root.
 * Call at a file's top level: it registers the hooks that start the server, stop what each test
 * served (and whatever it handed to `onCleanup`) after it, and remove the root at the end.
 */
export function participantsOverNats(deployment: string, token: string) {
  let nats: NatsFixture;
  let root: string;
  const started: ParticipantHandle<any>[] = [];
  const closers: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    nats = await startNats();
    root = await mkdtemp(join(tmpdir(), `gym-ckpt-${deployment}-`));
  });
  afterEach(async () => {
    for (const p of started.splice(0)) await p.stop();
    for (const close of closers.splice(0)) await close();
  });
  afterAll(async () => {
    await nats?.close();
    if (root) await rm(root, { recursive: true, force: true });
  });

  return {
    /** `<root>/<id>`: a checkpoint's directory. */
    dir: (id: string) => join(root, id),
    /** Closed after the test, once its participants stopped (an HTTP app the adapter serves through). */
    onCleanup: (close: () => Promise<unknown>) => void closers.push(close),
    /** Serves `adapter` as kind/instance (not announced in the registry); returns its sender. */
    async serve(kind: Kind, instance: string, adapter: ParticipantKind<any>): Promise<SendControl> {
      started.push(await startParticipant({ nc: nats.nc, deployment, instance, token, adapter, checkpointRoot: root, announce: false }));
      return (op, body) => controlRequest(nats.nc, { deployment, kind, instance, token }, op, body, 10_000);
    },
    /** Writes a participant's records and manifest into checkpoint `id`, as its commit would. */
    writeRecords: (id: string, kind: Kind, instance: string, records: object[]) =>
      new FsCheckpointStorage().write({ checkpointDir: join(root, id), checkpointId: id, kind, instance }, records as never, {
        gate: new WriteGate(),
        createdAt: Date.now() / 1000,
        extra: {},
      }),
  };
}
