import { mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ReplayError } from "../../../participants/replay/errors.js";
import { readGymReplayConfig } from "../../../participants/replay/gym-replay-source.js";
import { MAX_REPLAY_CONFIG_BYTES } from "../../../participants/replay/replay-config.js";
import { readGuardedFifo } from "../../support/guarded-fifo.js";

/** `--replay-config` is read before the environment server starts: only a small regular file is read. */
let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "replay-config-file-"));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function refusal(path: string): { code: string; message: string } | "read" {
  try {
    readGymReplayConfig(path);
    return "read";
  } catch (error) {
    if (!(error instanceof ReplayError)) throw error;
    return { code: error.code, message: error.message };
  }
}

describe("readGymReplayConfig: what the config path is", () => {
  it("a FIFO is refused at once, invalid_request naming it; no reader waits for a writer", () => {
    const fifo = join(dir, "config.fifo");
    const { outcome, ms } = readGuardedFifo(fifo, (path) => refusal(path));
    expect({ outcome, quick: ms < 1_000 }).toEqual({
      outcome: { code: "invalid_request", message: `replay config ${fifo} is not a regular file` },
      quick: true,
    });
  });

  it("a device is refused, invalid_request naming it", () => {
    expect(refusal("/dev/null")).toEqual({ code: "invalid_request", message: "replay config /dev/null is not a regular file" });
  });

  it(`a file over ${MAX_REPLAY_CONFIG_BYTES} bytes is refused unread, invalid_request naming it; one at the limit is read`, () => {
    const big = join(dir, "big.json");
    writeFileSync(big, "");
    truncateSync(big, MAX_REPLAY_CONFIG_BYTES + 1); // sparse: no megabytes written
    expect(refusal(big)).toEqual({ code: "invalid_request", message: `replay config ${big} is ${MAX_REPLAY_CONFIG_BYTES + 1} bytes, over the ${MAX_REPLAY_CONFIG_BYTES}-byte limit` });
    const text = JSON.stringify({ records: join(dir, "*.jsonl"), source: { id: "reference-gym" } });
    const fits = join(dir, "fits.json");
    writeFileSync(fits, text + " ".repeat(MAX_REPLAY_CONFIG_BYTES - text.length));
    expect(readGymReplayConfig(fits).cwd).toBe(dir);
  });

  it("a missing file is still invalid_request naming it", () => {
    const missing = join(dir, "missing.json");
    const outcome = refusal(missing);
    expect(outcome).toMatchObject({ code: "invalid_request" });
    expect((outcome as { message: string }).message).toContain(`replay config ${missing} is not readable`);
  });
});

describe("readGymReplayConfig: what the config says", () => {
  it("a key named twice in one object is refused, invalid_request naming it (JSON.parse kept the last without a word)", () => {
    // An edited mode appended below the old one: the server ran the other mode than the file's reader sees first.
    const file = join(dir, "twice.json");
    writeFileSync(file, `{"records": "*.jsonl", "source": {"id": "reference-gym"}, "mode": "recheck", "mode": "continue"}`);
    expect(refusal(file)).toEqual({ code: "invalid_request", message: `replay config ${file} names the key "mode" twice in one object` });
    writeFileSync(file, `{"records": "*.jsonl", "source": {"id": "reference-gym", "id": "reference-gym"}}`);
    expect(refusal(file)).toMatchObject({ code: "invalid_request", message: expect.stringContaining(`"id" twice`) });
  });
});
