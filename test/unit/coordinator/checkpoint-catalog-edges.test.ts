import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { refusalOf } from "../../support/refusal.js";

let base: string;
beforeEach(async () => {
  base = await mkdtemp(join(tmpdir(), "gym-ckpt-catalog-edges-"));
});
afterEach(async () => {
  await rm(base, { recursive: true, force: true });
});

describe("the checkpoint catalog at its edges", () => {
  // "0: none": a root without published checkpoints raises no epoch floor.
  it("has highest epoch 0 when nothing is published", () => {
    expect(new CheckpointCatalog(base).highestEpoch()).toBe(0);
  });

  // leftover answers free only for ENOENT; any other failure to look (here the root is a file:
  // ENOTDIR) is thrown, never read as an answer.
  it("leftover throws what the lstat refused rather than answering", async () => {
    const file = join(base, "a-file");
    await writeFile(file, "x");
    expect(() => new CheckpointCatalog(file).leftover("c1")).toThrow(expect.objectContaining({ code: "ENOTDIR" }));
  });

  it("refuses a checkpoint.json that is not JSON as such (invalid_checkpoint_state)", async () => {
    await mkdir(join(base, "c1"));
    await writeFile(join(base, "c1", "checkpoint.json"), "{not json");
    expect(await refusalOf(new CheckpointCatalog(base).get("c1"))).toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("is not valid JSON") });
  });
});
