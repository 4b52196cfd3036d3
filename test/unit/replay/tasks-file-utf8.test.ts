import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { readTaskFile } from "../../../participants/replay/task-file.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "seeds-tasks-utf8-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/**
 * docs/replay.md (`gym-ckpt seeds`): a --tasks line that is not valid UTF-8 is refused with
 * invalid_request naming `<file>:<line>`, as `collect --tasks` refuses it. It was decoded with
 * U+FFFD in place of each bad byte and its task kept: a seed's task then differed from the one run,
 * and its digest matched no checkpoint episode.
 */
describe("seeds --tasks: a line that is not UTF-8", () => {
  it("is invalid_request naming the file and line", async () => {
    const file = join(dir, "tasks.jsonl");
    const latin1 = Buffer.from('{"expression":"caf\xe9"}\n', "latin1"); // é as the single byte 0xE9
    await writeFile(file, Buffer.concat([Buffer.from('{"expression":"1+1"}\n\n'), latin1]));
    await expect(readTaskFile(file)).rejects.toMatchObject({
      code: "invalid_request",
      message: `${file}:3: not UTF-8 text (a Latin-1 or UTF-16 export?); save the tasks file as UTF-8`,
    });
  });

  it("valid UTF-8, a byte order mark and a written U+FFFD are still read", async () => {
    const file = join(dir, "tasks.jsonl");
    await writeFile(file, '\uFEFF{"expression":"café"}\r\n{"expression":"\uFFFD"}\n');
    await expect(readTaskFile(file)).resolves.toEqual([{ expression: "café" }, { expression: "\uFFFD" }]);
  });
});
