import { constants } from "node:buffer";
import { execFileSync } from "node:child_process";
import { copyFile, mkdir, readFile, rm, symlink, truncate, writeFile } from "node:fs/promises";
import fs from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  checkIndex,
  encodeIndex,
  indexPathFor,
  maxIndexBytes,
  newReadStats,
  readRecords,
  ReplayError,
  writeRolloutRecords,
  writeStepRecords,
  type IndexHeader,
  type IndexRow,
  type ReadStats,
  type RecordFilters,
} from "../../../participants/replay/index.js";
import { collect, compactedTrace, linearTrace, silent, tempDir, traceId, writeHandIndexed } from "./fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

const open: RecordFilters = { minReward: null, maxReward: null, minBranches: 1 };
const incorrect: RecordFilters = { minReward: null, maxReward: 0.5, minBranches: 1 };

async function read(file: string, filters: RecordFilters, extra: { useIndex?: boolean; verifySha256?: boolean } = {}) {
  const stats = newReadStats();
  const records = await collect(readRecords(file, { filters, stats, logger: silent, ...extra }));
  return { ids: records.map((r) => r.trace.id), records, stats };
}

/** Ten records, rewards 0,1,0,1…; half are "incorrect". */
function tenTraces() {
  return Array.from({ length: 10 }, (_, i) => (i % 3 === 2 ? compactedTrace(traceId(i), i % 2) : linearTrace(traceId(i), i % 2)));
}

describe("index-selected loading", () => {
  it("(19) yields exactly what a full parse yields, and index paths are derived per kind", async () => {
    const indexed = path.join(dir, "indexed", "step_1");
    const plain = path.join(dir, "plain", "step_1");
    const { recordPath } = await writeRolloutRecords(path.join(dir, "indexed"), 1, { kind: "train", env: "gsm8k", traces: tenTraces() });
    await mkdir(plain, { recursive: true });
    const plainPath = path.join(plain, "train_rollouts_gsm8k.jsonl");
    await copyFile(recordPath, plainPath); // record files are byte-identical with or without an index

    const a = await read(recordPath, incorrect);
    const b = await read(plainPath, incorrect);
    expect(a.ids).toEqual([0, 2, 4, 6, 8].map(traceId));
    expect(b.records.map((r) => r.trace)).toEqual(a.records.map((r) => r.trace));
    expect(b.records.map((r) => [r.offset, r.len, r.ordinal])).toEqual(a.records.map((r) => [r.offset, r.len, r.ordinal]));
    expect([a.stats.filesIndexed, a.stats.spansRead, a.stats.skipped.source_reward]).toEqual([1, 5, 5]);
    expect([b.stats.filesFullParsed, b.stats.spansRead, b.stats.skipped.source_reward]).toEqual([1, 0, 5]);

    expect(indexPathFor(recordPath)).toBe(path.join(indexed, "index_train_gsm8k.jsonl"));
    await expect(fs.access(indexPathFor(recordPath)!)).resolves.toBeUndefined();
    await expect(fs.access(indexPathFor(plainPath)!)).rejects.toThrow();
    expect(indexPathFor(path.join(dir, "records.jsonl"))).toBeNull();
    expect(indexPathFor(path.join(dir, "train_rollouts.jsonl"))).toBeNull(); // old mixed file: always fully parsed
    expect(indexPathFor(path.join(dir, "eval_rollouts_gsm8k.jsonl"))).toBe(path.join(dir, "index_eval_gsm8k.jsonl"));
  });

  it("parses only the selected spans: bytes parsed equal the selected bytes", async () => {
    const { recordPath, bytes } = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: tenTraces() });
    const a = await read(recordPath, incorrect);
    const selected = a.records.reduce((n, r) => n + r.len, 0);
    expect(a.stats.bytesParsed).toBe(selected);
    expect(a.stats.bytesRead).toBe(selected);
    const full = await read(recordPath, incorrect, { useIndex: false });
    expect(full.stats.bytesParsed).toBe(bytes);
    expect(full.ids).toEqual(a.ids);
  });

  it("(20) never reads filtered spans: invalid JSON there is fine with the index, fatal without", async () => {
    const good = (i: number, reward: number) => ({ line: JSON.stringify(linearTrace(traceId(i), reward)), row: { trace: traceId(i), task_name: "gsm8k", reward, branches: 1 } });
    const { recordPath, indexPath } = await writeHandIndexed(path.join(dir, "step_1"), "train_rollouts_gsm8k.jsonl", [
      good(1, 0),
      { line: "{this is not json at all", row: { trace: traceId(2), task_name: "gsm8k", reward: 1, branches: 1 } },
      good(3, 0),
      { line: "also not json", row: { trace: traceId(4), task_name: "recheck:00000001", reward: 0, branches: 1 } },
    ]);
    const a = await read(recordPath, incorrect);
    expect(a.ids).toEqual([traceId(1), traceId(3)]);
    expect(a.stats.skipped).toEqual({ replayed: 1, empty: 0, source_reward: 1, no_seed: 0 });
    await rm(indexPath);
    await expect(read(recordPath, incorrect)).rejects.toThrow(/train_rollouts_gsm8k\.jsonl:2: not a JSON rollout record/);
  });

  it("(21) prefilters by branch count for compaction without reading linear records", async () => {
    const compacted = compactedTrace(traceId(2), 0);
    const { recordPath } = await writeHandIndexed(path.join(dir, "step_1"), "train_rollouts_gsm8k.jsonl", [
      { line: "linear record bytes that are not JSON", row: { trace: traceId(1), task_name: "gsm8k", reward: 0, branches: 1 } },
      { line: JSON.stringify(compacted), row: { trace: traceId(2), task_name: "gsm8k", reward: 0, branches: 2 } },
    ]);
    const a = await read(recordPath, { ...open, minBranches: 2 });
    expect(a.ids).toEqual([traceId(2)]);
    expect(a.stats.skipped.no_seed).toBe(1);
  });

  it("min_source_reward keeps only records at or above it, on both paths alike", async () => {
    const traces = [linearTrace(traceId(1), 0), linearTrace(traceId(2), 0.5), linearTrace(traceId(3), 1)];
    const { recordPath } = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces });
    for (const useIndex of [true, false]) {
      const r = await read(recordPath, { ...open, minReward: 0.5 }, { useIndex });
      expect(r.ids).toEqual([traceId(2), traceId(3)]); // inclusive bound
      expect(r.stats.skipped.source_reward).toBe(1);
      expect(r.stats.filesIndexed).toBe(useIndex ? 1 : 0);
    }
  });

  it("skips blank lines and empty traces on both paths alike", async () => {
    const empty = linearTrace(traceId(9));
    empty.nodes = [];
    const { recordPath } = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [empty, linearTrace(traceId(1))] });
    for (const useIndex of [true, false]) {
      const r = await read(recordPath, open, { useIndex });
      expect(r.ids).toEqual([traceId(1)]);
      expect(r.stats.skipped.empty).toBe(1);
    }
    const hand = path.join(dir, "records.jsonl");
    await writeFile(hand, "\n" + JSON.stringify(linearTrace(traceId(1))) + "\n\n  \n" + JSON.stringify(linearTrace(traceId(2))) + "\n");
    expect((await read(hand, open)).ids).toEqual([traceId(1), traceId(2)]);
  });

  it("rejects JSON that is not a rollout record with file:line", async () => {
    const hand = path.join(dir, "records.jsonl");
    await writeFile(hand, JSON.stringify(linearTrace(traceId(1))) + "\n" + JSON.stringify({ id: "x", reward: 1 }) + "\n");
    const error = await read(hand, open).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect((error as ReplayError).code).toBe("invalid_checkpoint_state");
    expect((error as ReplayError).message).toMatch(/records\.jsonl:2: not a rollout record/);
  });
});

describe("append-mode files", () => {
  it("tolerate a torn last line but not a corrupt middle line", async () => {
    const hand = path.join(dir, "traces.jsonl");
    const full = JSON.stringify(linearTrace(traceId(3)));
    await writeFile(hand, [linearTrace(traceId(1)), linearTrace(traceId(2))].map((t) => JSON.stringify(t) + "\n").join("") + full.slice(0, 100));
    const r = await read(hand, open);
    expect(r.ids).toEqual([traceId(1), traceId(2)]);
    expect(r.stats.tornLines).toBe(1);
    // A complete final line without its newline is a record, not a tear.
    await writeFile(hand, JSON.stringify(linearTrace(traceId(1))) + "\n" + full);
    expect((await read(hand, open)).ids).toEqual([traceId(1), traceId(3)]);
    await writeFile(hand, full.slice(0, 100) + "\n" + full + "\n");
    await expect(read(hand, open)).rejects.toThrow(/traces\.jsonl:1: not a JSON rollout record/);
  });

  it("refuse a newline-less last line that is whole JSON but no record: no tear leaves parseable JSON", async () => {
    // A prefix of a record's object never parses, so JSON that does is a complete line gone wrong.
    const hand = path.join(dir, "traces.jsonl");
    const bad = { ...linearTrace(traceId(2)), reward: 1 };
    await writeFile(hand, JSON.stringify(linearTrace(traceId(1))) + "\n" + JSON.stringify(bad));
    const stats = newReadStats();
    await expect(collect(readRecords(hand, { filters: open, stats, logger: silent }))).rejects.toMatchObject({
      code: "invalid_checkpoint_state",
      message: expect.stringMatching(/traces\.jsonl:2: not a rollout record/),
    });
    expect(stats.tornLines).toBe(0);
  });
});

describe("a record file appended to while it is read", () => {
  it("reads what the file held when it was opened, on both paths alike, never what an appender adds meanwhile", async () => {
    await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1)), linearTrace(traceId(2))] });
    const file = path.join(dir, "step_1", "train_rollouts_gsm8k.jsonl");
    const size = (await fs.stat(file)).size;
    const appended = JSON.stringify(linearTrace(traceId(9))) + "\n";
    for (const useIndex of [true, false]) {
      await truncate(file, size);
      const stats = newReadStats();
      const ids: string[] = [];
      for await (const record of readRecords(file, { filters: open, stats, logger: silent, useIndex })) {
        ids.push(record.trace.id);
        if (ids.length === 1) await fs.appendFile(file, appended); // an append-mode writer, mid-read
      }
      expect({ useIndex, ids }).toEqual({ useIndex, ids: [traceId(1), traceId(2)] });
      expect(stats.bytesRead).toBeLessThanOrEqual(size);
    }
  });
});

describe("long lines", () => {
  it("join the pieces of a line spanning many read chunks once, not once per chunk", async () => {
    const hand = path.join(dir, "traces.jsonl");
    const huge = "x".repeat(20 << 20); // five 4 MiB read chunks, no newline: a torn final line
    await writeFile(hand, JSON.stringify(linearTrace(traceId(1))) + "\n" + huge);
    const concat = vi.spyOn(Buffer, "concat");
    try {
      const r = await read(hand, open, { useIndex: false });
      expect(r.ids).toEqual([traceId(1)]);
      expect(r.stats.tornLines).toBe(1);
      expect(concat.mock.calls.length).toBeLessThanOrEqual(1);
    } finally {
      concat.mockRestore();
    }
  });
});

describe("lines longer than any record", () => {
  it("refuse a line past the longest decodable string as soon as it gets there, without buffering the rest", { timeout: 60_000 }, async () => {
    // A line longer than any string can never parse; buffering it whole held a file's worth of
    // memory (a 5 GiB newline-less file ended in a RangeError, not a catalog refusal).
    const hand = path.join(dir, "traces.jsonl");
    const junk = 1 << 30;
    await writeFile(hand, "");
    await truncate(hand, junk); // sparse zeros, no newline
    await fs.appendFile(hand, "\n" + JSON.stringify(linearTrace(traceId(1))) + "\n");
    const stats = newReadStats();
    const error = await collect(readRecords(hand, { filters: open, stats, logger: silent })).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("traces.jsonl:1: line is longer than") });
    expect(stats.bytesRead).toBeLessThan(junk);
  });
});

describe("stale, foreign and hostile indexes", () => {
  async function fixture() {
    const traces = [linearTrace(traceId(1), 0), linearTrace(traceId(2), 1), linearTrace(traceId(3), 0)];
    const written = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces });
    const lines = (await readFile(written.indexPath, "utf8")).trimEnd().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    return { ...written, size: written.bytes, header: lines[0] as IndexHeader, rows: lines.slice(1) as IndexRow[] };
  }

  /** Reads while recording every positioned read on any file handle (the record file's; the index is read sequentially). */
  async function readSpying(file: string, filters: RecordFilters, verifySha256 = false) {
    const probe = await fs.open(file, "r");
    const proto = Object.getPrototypeOf(probe) as { read: (...args: unknown[]) => Promise<{ bytesRead: number }> };
    await probe.close();
    const reads: Array<{ position: number; length: number }> = [];
    const original = proto.read;
    const spy = vi.spyOn(proto, "read").mockImplementation(function (this: unknown, ...args: unknown[]) {
      if (typeof args[3] === "number") reads.push({ position: args[3], length: args[2] as number });
      return original.apply(this, args);
    });
    try {
      return { ...(await read(file, filters, { verifySha256 })), reads };
    } finally {
      spy.mockRestore();
    }
  }

  const cases: Array<[string, (f: Awaited<ReturnType<typeof fixture>>) => { header: IndexHeader; rows: IndexRow[] }]> = [
    ["offset past the end", (f) => ({ header: f.header, rows: f.rows.map((r, i) => (i === 1 ? { ...r, offset: f.size + 1000 } : r)) })],
    ["negative length", (f) => ({ header: f.header, rows: f.rows.map((r, i) => (i === 1 ? { ...r, len: -5 } : r)) })],
    ["overlapping spans", (f) => ({ header: f.header, rows: f.rows.map((r, i) => (i === 1 ? { ...r, offset: r.offset - 10, len: r.len + 10 } : r)) })],
    ["a gap between spans", (f) => ({ header: f.header, rows: f.rows.map((r, i) => (i === 1 ? { ...r, len: r.len - 3 } : i === 2 ? { ...r, offset: r.offset - 3 + 3 } : r)) })],
    ["a huge length", (f) => ({ header: { ...f.header, size: 2 ** 40 }, rows: f.rows.map((r, i) => (i === 2 ? { ...r, len: 2 ** 40 } : r)) })],
    ["a size mismatch", (f) => ({ header: { ...f.header, size: f.size + 1 }, rows: f.rows })],
    ["a header naming another file", (f) => ({ header: { ...f.header, record_file: "train_rollouts_other.jsonl" }, rows: f.rows })],
    ["a row count mismatch", (f) => ({ header: { ...f.header, records: 2 }, rows: f.rows })],
    ["a header of another step", (f) => ({ header: { ...f.header, step: 2 }, rows: f.rows })],
    ["a header of no step inside a step directory", (f) => ({ header: { ...f.header, step: null }, rows: f.rows })],
    ["an unknown row key", (f) => ({ header: f.header, rows: f.rows.map((r) => ({ ...r, length: r.len }) as IndexRow) })],
  ];

  for (const [name, mutate] of cases) {
    it(`ignores an index with ${name}, reading nothing outside the file`, async () => {
      const f = await fixture();
      const { header, rows } = mutate(f);
      await writeFile(f.indexPath, encodeIndex(header, rows));
      const r = await readSpying(f.recordPath, incorrect);
      expect(r.ids).toEqual([traceId(1), traceId(3)]); // fell back to a correct full parse
      expect(r.stats.indexRejected).toBe(1);
      expect(r.stats.spansRead).toBe(0);
      expect(r.stats.bytesRead).toBe(f.size);
      expect(r.reads.length).toBeGreaterThan(0);
      for (const read of r.reads) expect(read.position).toBeLessThanOrEqual(f.size);
      expect(r.reads.reduce((n, x) => Math.max(n, x.position), 0)).toBeLessThanOrEqual(f.size);
    });
  }

  it("ignores an oversized index without reading it", async () => {
    const f = await fixture();
    await writeFile(f.indexPath, (await readFile(f.indexPath, "utf8")) + "\n".repeat(maxIndexBytes(f.size)));
    const r = await read(f.recordPath, incorrect);
    expect([r.ids.length, r.stats.indexRejected, r.stats.indexBytesRead, r.stats.filesFullParsed]).toEqual([2, 1, 0, 1]);
  });

  it("ignores, unread, an index within 4 × a large record file but longer than any string", { timeout: 60_000 }, async () => {
    // A record file past 128 MiB allows an index past the longest string V8 can make (512 MiB):
    // decoding one threw ERR_STRING_TOO_LONG and refused every reload instead of parsing in full.
    const f = await fixture();
    const longest = constants.MAX_STRING_LENGTH;
    const recordSize = Math.ceil((longest - (1 << 20)) / 4) + 1;
    await truncate(f.recordPath, recordSize); // sparse zeros: a torn, newline-less last line
    await rm(f.indexPath);
    await writeFile(f.indexPath, "");
    await truncate(f.indexPath, longest + 1); // sparse too
    expect(longest + 1).toBeLessThanOrEqual((1 << 20) + 4 * recordSize); // within the size rule alone
    const r = await read(f.recordPath, incorrect);
    expect([r.ids.length, r.stats.indexRejected, r.stats.indexBytesRead, r.stats.filesFullParsed, r.stats.tornLines]).toEqual([2, 1, 0, 1, 1]);
  });

  it("ignores a FIFO index at once instead of blocking on it", { timeout: 5000 }, async () => {
    const f = await fixture();
    await rm(f.indexPath);
    execFileSync("mkfifo", [f.indexPath]);
    const r = await read(f.recordPath, incorrect);
    expect([r.ids.length, r.stats.indexRejected, r.stats.indexBytesRead, r.stats.filesFullParsed]).toEqual([2, 1, 0, 1]);
  });

  it("ignores an index linked to a device unread (its stat size 0 is no bound)", { timeout: 5000 }, async () => {
    const f = await fixture();
    await rm(f.indexPath);
    await symlink("/dev/zero", f.indexPath);
    const r = await read(f.recordPath, incorrect);
    expect([r.ids.length, r.stats.indexRejected, r.stats.filesFullParsed]).toEqual([2, 1, 1]);
    expect(r.stats.indexBytesRead).toBeLessThanOrEqual(maxIndexBytes(f.size));
    expect(r.stats.indexBytesRead).toBe(0);
  });

  it("refuses a record file that is not a regular file instead of blocking on it", { timeout: 5000 }, async () => {
    const fifo = path.join(dir, "step_1", "train_rollouts_fifo.jsonl");
    await mkdir(path.dirname(fifo), { recursive: true });
    execFileSync("mkfifo", [fifo]);
    const error = await read(fifo, open).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("not a regular file") });
  });

  it("ignores an index that is not JSON lines", async () => {
    const f = await fixture();
    await writeFile(f.indexPath, "garbage\n");
    const r = await read(f.recordPath, incorrect);
    expect([r.ids.length, r.stats.indexRejected, r.stats.filesFullParsed]).toEqual([2, 1, 1]);
  });

  // The index may be 1 MiB + 4 × its record file (512 MiB at most): split whole and every line parsed
  // before the header was looked at, a garbage one cost ~24 times its size in heap (33 MiB of "0"
  // lines: ~800 MiB) and could kill the worker instead of falling back to a full parse.
  it("rejects a garbage index at its first bad line, without parsing (or splitting) the rest", () => {
    const expectation = { recordFile: "train_rollouts_gsm8k.jsonl", kind: "train", env: "gsm8k", step: 1, size: 100 };
    const parse = vi.spyOn(JSON, "parse");
    try {
      const garbage = Buffer.from("0\n".repeat(9 * 2 ** 19)); // 9 MiB, no header on line 1
      expect(checkIndex(garbage, expectation)).toMatchObject({ ok: false, reason: expect.stringMatching(/^bad header/) });
      expect(parse).toHaveBeenCalledTimes(1);
      // A good header claiming 2 records, then far more rows than that: stops at the third.
      const header: IndexHeader = { format: "gym-ckpt/rollout-index", version: 1, kind: "train", env: "gsm8k", step: 1, record_file: "train_rollouts_gsm8k.jsonl", size: 100, sha256: "0".repeat(64), records: 2 };
      const row = (offset: number): IndexRow => ({ trace: "t", task_idx: 0, task_name: null, reward: 0, policy_version: null, step: 1, branches: 1, turns: 1, stop: null, offset, len: 50 });
      const tooMany = `${JSON.stringify(header)}\n${Array.from({ length: 100_000 }, (_, i) => JSON.stringify(row(50 * i))).join("\n")}\n`;
      parse.mockClear();
      expect(checkIndex(Buffer.from(tooMany), expectation)).toEqual({ ok: false, reason: "row count differs from header" });
      expect(parse).toHaveBeenCalledTimes(3);
      // The same index with its header's count is accepted, blank lines skipped as before.
      const exact = `${JSON.stringify(header)}\n\n${JSON.stringify(row(0))}\r\n${JSON.stringify(row(50))}\n`;
      expect(checkIndex(Buffer.from(exact), expectation)).toMatchObject({ ok: true, rows: [row(0), row(50)] });
    } finally {
      parse.mockRestore();
    }
  });

  it("detects a same-size content change by sha256 when asked to verify", async () => {
    const f = await fixture();
    const data = await readFile(f.recordPath);
    const at = data.indexOf("The answer is 42.", f.rows[1]!.offset); // inside a filtered (reward 1) record
    data.write("X", at);
    await writeFile(f.recordPath, data);
    const trusting = await read(f.recordPath, incorrect);
    expect([trusting.stats.filesIndexed, trusting.stats.bytesParsed]).toEqual([1, f.rows[0]!.len + f.rows[2]!.len]);
    const verified = await read(f.recordPath, incorrect, { verifySha256: true });
    expect([verified.stats.indexRejected, verified.stats.filesFullParsed]).toEqual([1, 1]);
    expect(verified.ids).toEqual([traceId(1), traceId(3)]);
  });

  it("refuses with index_mismatch when a selected span disagrees with its row", async () => {
    const f = await fixture();
    const data = await readFile(f.recordPath);
    data.write(traceId(7), data.indexOf(traceId(3))); // same size, different trace id in a selected record
    await writeFile(f.recordPath, data);
    const error = await read(f.recordPath, incorrect).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect((error as ReplayError).reason).toBe("index_mismatch");
    expect((error as ReplayError).code).toBe("invalid_checkpoint_state");
    expect((await read(f.recordPath, incorrect, { useIndex: false })).ids).toEqual([traceId(1), traceId(7)]);
  });

  it("refuses with index_mismatch when a selected record's branch count differs from its row", async () => {
    // A row claiming one branch for a compacted (two-branch) record: the branch prefilter would be wrong.
    const compacted = compactedTrace(traceId(2), 0);
    const { recordPath } = await writeHandIndexed(path.join(dir, "step_1"), "train_rollouts_gsm8k.jsonl", [
      { line: JSON.stringify(compacted), row: { trace: traceId(2), task_name: "gsm8k", reward: 0, branches: 1 } },
    ]);
    const error = await read(recordPath, open).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", reason: "index_mismatch" });
    expect((await read(recordPath, open, { useIndex: false })).ids).toEqual([traceId(2)]);
  });

  it("refuses with index_mismatch (so the loader falls back to a full parse) when a stale span covers two lines", async () => {
    const f = await fixture();
    // A well-formed index (contiguous spans tiling the file) whose first span covers two records:
    // its last byte is a newline, so only a newline inside the span gives it away.
    const twoLines: IndexRow[] = [{ ...f.rows[0]!, len: f.rows[0]!.len + f.rows[1]!.len }, { ...f.rows[2]! }];
    await writeFile(f.indexPath, encodeIndex({ ...f.header, records: 2 }, twoLines));
    const error = await read(f.recordPath, incorrect).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect((error as ReplayError).reason).toBe("index_mismatch");
  });

  it("refuses with index_mismatch, not a RangeError, a span longer than any buffer", async () => {
    // A record file past 4 GiB (sparse here) and an index whose one row spans all of it: the row
    // tiles the file, so only the span read shows it, and no Buffer that long can be allocated.
    const { recordPath, indexPath } = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] });
    const size = 5 * 2 ** 30;
    await truncate(recordPath, size);
    const [header, row] = (await readFile(indexPath, "utf8")).trimEnd().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    await writeFile(indexPath, encodeIndex({ ...(header as IndexHeader), size }, [{ ...(row as IndexRow), len: size }]));
    const error = await read(recordPath, open).then(() => null, (e: unknown) => e);
    expect(error).toBeInstanceOf(ReplayError);
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", reason: "index_mismatch" });
  });

  it("refuses with index_mismatch, unread, a span longer than any record line can be", { timeout: 60_000 }, async () => {
    // 1 GiB (sparse): a Buffer holds it, but no string decodes from it, so no record is that long.
    // Reading it would hold a hostile index's whole span in memory for nothing.
    const { recordPath, indexPath } = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0)] });
    const size = 2 ** 30;
    await truncate(recordPath, size);
    const [header, row] = (await readFile(indexPath, "utf8")).trimEnd().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>);
    await writeFile(indexPath, encodeIndex({ ...(header as IndexHeader), size }, [{ ...(row as IndexRow), len: size }]));
    const stats = newReadStats();
    const error = await collect(readRecords(recordPath, { filters: open, stats, logger: silent })).then(() => null, (e: unknown) => e);
    expect(error).toMatchObject({ code: "invalid_checkpoint_state", reason: "index_mismatch" });
    expect([stats.bytesRead, stats.spansRead]).toEqual([0, 0]);
  });

  it("ignores an index copied from another step, which would otherwise drop records unread", async () => {
    // Same env, same size, different rewards: the copied index tiles the file and passes every other check.
    const a = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 1)] });
    const b = await writeRolloutRecords(dir, 2, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(2), 0)] });
    expect(a.bytes).toBe(b.bytes);
    await copyFile(a.indexPath, b.indexPath);
    const r = await read(b.recordPath, incorrect);
    expect([r.ids, r.stats.indexRejected, r.stats.filesFullParsed]).toEqual([[traceId(2)], 1, 1]);
    // Outside a step directory an index must name no step either.
    const flat = path.join(dir, "flat");
    await mkdir(flat);
    await copyFile(b.recordPath, path.join(flat, "train_rollouts_gsm8k.jsonl"));
    await copyFile(a.indexPath, path.join(flat, "index_train_gsm8k.jsonl"));
    const f = await read(path.join(flat, "train_rollouts_gsm8k.jsonl"), incorrect);
    expect([f.ids, f.stats.indexRejected, f.stats.filesFullParsed]).toEqual([[traceId(2)], 1, 1]);
  });

  it("keeps train and eval of one env apart even when a glob matches both", async () => {
    await writeStepRecords(dir, 1, [
      { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0), linearTrace(traceId(2), 0)] },
      { kind: "eval", env: "gsm8k", traces: [linearTrace(traceId(3), 0)] },
    ]);
    const step = path.join(dir, "step_1");
    const evalFile = path.join(step, "eval_rollouts_gsm8k.jsonl");
    const e = await read(evalFile, incorrect);
    expect([e.ids, e.stats.filesIndexed]).toEqual([[traceId(3)], 1]);
    // The upstream hazard: eval read with the train index's spans. Here the header names the train file.
    await copyFile(path.join(step, "index_train_gsm8k.jsonl"), path.join(step, "index_eval_gsm8k.jsonl"));
    const hazard = await read(evalFile, incorrect);
    expect([hazard.ids, hazard.stats.indexRejected, hazard.stats.filesFullParsed]).toEqual([[traceId(3)], 1, 1]);
  });

  it("parses in full, not refuses, a record file whose env is longer than any index is named after (over 200 characters)", async () => {
    const { recordPath } = await writeRolloutRecords(dir, 1, { kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1), 0), linearTrace(traceId(2), 1)] });
    const long = path.join(dir, "step_1", `train_rollouts_${"e".repeat(201)}.jsonl`);
    await copyFile(recordPath, long);
    expect(indexPathFor(long)).toBeNull();
    const r = await read(long, open);
    expect([r.ids, r.stats.filesFullParsed, r.stats.filesIndexed]).toEqual([[traceId(1), traceId(2)], 1, 0]);
  });
});

describe("read stats", () => {
  it("start at zero", () => {
    const s: ReadStats = newReadStats();
    expect(Object.values(s).filter((v) => typeof v === "number").every((v) => v === 0)).toBe(true);
  });
});
