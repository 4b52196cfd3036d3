import { mkdtempSync, rmSync, symlinkSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { fileLayer, MAX_CONFIG_FILE_BYTES } from "../../../coordinator/config/config-loader.js";
import { MAX_EPISODES_FILE_BYTES, controllerStateFrom, parseEpisodes } from "../../../coordinator/cli/shared.js";
import { CheckpointError } from "../../../protocol/index.js";
import { readGuardedFifo } from "../../support/guarded-fifo.js";

/** The coordinator's `--config` and a command's `--episodes @file` are read only if they are small regular files. */
let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "cli-input-files-"));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function refusal(read: () => unknown): { code: string; message: string } | "read" {
  try {
    read();
    return "read";
  } catch (error) {
    if (!(error instanceof CheckpointError)) throw error;
    return { code: error.code, message: error.message };
  }
}

// fileLayer is what loadConfig reads --config (or GYM_CKPT_CONFIG) with.
const readConfig = (path: string) => () => fileLayer(path);
const readEpisodes = (path: string) => () => parseEpisodes(`@${path}`);

const readers = [
  { what: "--config", read: readConfig, name: "config file", limit: MAX_CONFIG_FILE_BYTES },
  { what: "--episodes @file", read: readEpisodes, name: "episodes file", limit: MAX_EPISODES_FILE_BYTES },
];

describe.each(readers)("$what: what the path is", ({ read, name, limit }) => {
  it("a FIFO is refused at once, invalid_request naming it; no reader waits for a writer", () => {
    const fifo = join(dir, "input.fifo");
    const { outcome, ms } = readGuardedFifo(fifo, (path) => refusal(read(path)));
    expect({ outcome, quick: ms < 1_000 }).toEqual({
      outcome: { code: "invalid_request", message: `${name} ${fifo} is not a regular file` },
      quick: true,
    });
  });

  it("a device is refused, invalid_request naming it", () => {
    expect(refusal(read("/dev/null"))).toEqual({ code: "invalid_request", message: `${name} /dev/null is not a regular file` });
  });

  it("a file one byte over the limit is refused unread, invalid_request naming it", () => {
    const big = join(dir, "big.json");
    writeFileSync(big, "");
    truncateSync(big, limit + 1); // sparse: no megabytes written
    expect(refusal(read(big))).toEqual({ code: "invalid_request", message: `${name} ${big} is ${limit + 1} bytes, over the ${limit}-byte limit` });
  });

  it("a symbolic link to a file is followed (mounted configs often are links)", () => {
    const file = join(dir, "real.json");
    writeFileSync(file, name === "config file" ? "{}" : "[]");
    const link = join(dir, "link.json");
    symlinkSync(file, link);
    expect(refusal(read(link))).toBe("read");
  });
});

describe("the limits", () => {
  it("a config file at the limit is read", () => {
    const text = JSON.stringify({ retention: 3 });
    const fits = join(dir, "fits.json");
    writeFileSync(fits, text + " ".repeat(MAX_CONFIG_FILE_BYTES - text.length));
    expect(fileLayer(fits)).toEqual({ retention: 3 });
  });

  it("an episodes file at the limit is read", () => {
    const text = JSON.stringify(["r2-a1"]);
    const fits = join(dir, "fits.json");
    writeFileSync(fits, text + " ".repeat(MAX_EPISODES_FILE_BYTES - text.length));
    expect(parseEpisodes(`@${fits}`)).toEqual([{ rollout_id: "r2", attempt: 1 }]);
  });

  it("a missing file is still invalid_request naming it", () => {
    const missing = join(dir, "missing.json");
    expect(refusal(readEpisodes(missing))).toEqual({ code: "invalid_request", message: `episodes file ${missing} does not exist` });
    const outcome = refusal(readConfig(missing));
    expect(outcome).toMatchObject({ code: "invalid_request" });
    expect((outcome as { message: string }).message).toContain(`cannot read config file ${missing}`);
  });
});

describe("--state-json with an integer JSON.parse cannot hold exactly", () => {
  it("is invalid_request naming it, before anything is sent, as the coordinator refuses such a body", async () => {
    expect(() => controllerStateFrom({ stateJson: '{"seed":9223372036854775807}' })).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("9223372036854775807") }));
    expect(controllerStateFrom({ stateJson: '{"seed":9007199254740991}' })).toEqual({ inline: { seed: 9007199254740991 } });
  });
});
