import type * as DurableFs from "../../../coordinator/publication/durable-fs.js";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
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
// Every directory fsynced, in order.
const synced = vi.hoisted((): string[] => []);
const shortMarker = `${JSON.stringify({ format: "gym-ckpt/rollout-step", version: 1, step: 1, kind: "train", files: ["train_rollouts_b.jsonl"] })}\n`;
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const actual = await importOriginal<typeof DurableFs>();
  const replaceFileDurably = async (file: string, data: string | Uint8Array) => {
    await actual.replaceFileDurably(file, data);
    if (race.on && path.basename(file) === "_complete_train.json") {
      await actual.replaceFileDurably(file, shortMarker);
    }
  };
  const fsyncDirectory = async (directory: string) => {
    synced.push(path.resolve(directory));
    await actual.fsyncDirectory(directory);
  };
  return { ...actual, replaceFileDurably, fsyncDirectory };
});

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(async () => {
  race.on = false;
  synced.length = 0;
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

// A new directory's entry is in its parent, and only an fsync of that parent makes it survive a
// power loss: rollouts/, and every record file under it, could vanish though each file was synced.
describe("the collector's records sink: directories it creates are durable", () => {
  it("a start that creates rollouts/ and the records dir itself fsyncs the directory holding each, and a later start fsyncs none", async () => {
    const records = path.join(dir, "new", "records");
    const sink = () => new RolloutRecordsSink({ dir: records, env: "a", kind: "train", everyRows: 100, everySeconds: 600 }, silent);
    await sink().start();
    expect(synced).toEqual([records, path.join(dir, "new"), dir]);
    synced.length = 0;
    await sink().start();
    expect(synced).toEqual([]);
  });

  it("a flush that has to make rollouts/ again (removed since the start) fsyncs the records dir holding it", async () => {
    const records = sinkOf();
    await records.start();
    await rm(path.join(dir, "rollouts"), { recursive: true });
    synced.length = 0;
    records.add(linearTrace(traceId(0xc), 0));
    await records.close();
    expect(records.stats).toMatchObject({ steps: 1, records: 1, failedFlushes: 0 });
    expect(synced).toEqual(expect.arrayContaining([path.join(dir, "rollouts"), dir]));
    expect(synced.indexOf(dir)).toBeLessThan(synced.findIndex((d) => d.endsWith("step_1")));
  });
});
