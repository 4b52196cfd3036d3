import type * as DurableFs from "../../../coordinator/publication/durable-fs.js";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { RolloutRecordsSink } from "../../../coordinator/collect/rollout-records-sink.js";
import { RolloutStepMarkerSchema, toCheckpointError } from "../../../protocol/index.js";
import { writeRolloutRecords } from "../../../participants/replay/index.js";
import { linearTrace, silent, tempDir, traceId } from "../replay/fixtures.js";

/**
 * The records sink's start (`gym-ckpt collect --records-dir`) fails with a catalog code, never as
 * internal_error ("report a bug"): a records dir whose content is in the way is invalid_request
 * (exit 2); a step marker that concurrent writers keep shortening does not fail the start at all.
 */
// While set, every marker write is followed by a concurrent writer's stale one listing only `b`.
const race = vi.hoisted(() => ({ on: false }));
const shortMarker = `${JSON.stringify({ format: "gym-ckpt/rollout-step", version: 1, step: 1, kind: "train", files: ["train_rollouts_b.jsonl"] })}\n`;
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const actual = await importOriginal<typeof DurableFs>();
  const replaceFileDurably = async (file: string, data: string | Uint8Array) => {
    await actual.replaceFileDurably(file, data);
    if (race.on && path.basename(file) === "_complete_train.json") {
      await actual.replaceFileDurably(file, shortMarker);
    }
  };
  return { ...actual, replaceFileDurably };
});

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(async () => {
  race.on = false;
  await cleanup();
});

const sinkOf = () => new RolloutRecordsSink({ dir, env: "a", kind: "train", everyRows: 100, everySeconds: 600 }, silent);

describe("the collector's records sink: a start that cannot complete an earlier step's marker", () => {
  it("a directory where a step's marker should be is invalid_request naming --records-dir, not internal_error", async () => {
    const root = path.join(dir, "rollouts");
    await writeRolloutRecords(root, 1, { kind: "train", env: "a", traces: [linearTrace(traceId(0xa), 0)] });
    await mkdir(path.join(root, "step_1", "_complete_train.json"), { recursive: true });
    const error = await sinkOf().start().then(() => undefined, (e: unknown) => e);
    expect(toCheckpointError(error)).toMatchObject({ code: "invalid_request", message: expect.stringContaining(`--records-dir ${dir}: EISDIR`) });
  });

  it("a regular file where rollouts/ should be is invalid_request, not internal_error", async () => {
    await writeFile(path.join(dir, "rollouts"), "");
    const error = await sinkOf().start().then(() => undefined, (e: unknown) => e);
    expect(toCheckpointError(error)).toMatchObject({ code: "invalid_request", message: expect.stringContaining(`--records-dir ${dir}: EEXIST`) });
  });

  it("a marker concurrent writers keep shortening does not fail the start: the next flush completes it", async () => {
    const root = path.join(dir, "rollouts");
    await writeRolloutRecords(root, 1, { kind: "train", env: "a", traces: [linearTrace(traceId(0xa), 0)] });
    await writeRolloutRecords(root, 1, { kind: "train", env: "b", traces: [linearTrace(traceId(0xb), 0)] });
    await writeFile(path.join(root, "step_1", "_complete_train.json"), shortMarker);
    race.on = true;
    const sink = sinkOf();
    await sink.start();
    race.on = false;
    sink.add(linearTrace(traceId(0xc), 0));
    await sink.close();
    const marker = RolloutStepMarkerSchema.parse(JSON.parse(await readFile(path.join(root, "step_1", "_complete_train.json"), "utf8")));
    expect(marker.files).toEqual(["train_rollouts_a.jsonl", "train_rollouts_b.jsonl"]);
    expect(sink.stats).toMatchObject({ steps: 1, records: 1, failedFlushes: 0, unwritten: 0 });
  });
});
