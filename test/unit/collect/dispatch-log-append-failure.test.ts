import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";

/**
 * An append to `dispatched.jsonl` that fails part way (a full disk after its first chunk): half of
 * its text reaches the file, then the write rejects with ENOSPC. `failTruncates` makes the cut
 * after it fail too, as many times.
 */
const fault = vi.hoisted(() => ({ log: undefined as string | undefined, failAppends: 0, failTruncates: 0 }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const open: typeof real.open = async (path, flags, mode) => {
    const handle = await real.open(path, flags, mode);
    if (String(path) !== fault.log) return handle;
    return handleWith(handle, {
      appendFile: async (...args: Parameters<typeof handle.appendFile>) => {
        if (fault.failAppends <= 0) return handle.appendFile(...args);
        fault.failAppends--;
        const data = String(args[0]);
        await handle.appendFile(data.slice(0, data.length >> 1));
        throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });
      },
      truncate: async (len?: number) => {
        if (fault.failTruncates <= 0) return handle.truncate(len);
        fault.failTruncates--;
        throw Object.assign(new Error("EIO: i/o error, ftruncate"), { code: "EIO", syscall: "ftruncate" });
      },
    });
  };
  return withOverrides(real, { open });
});

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-dispatch-append-"));
  fault.log = join(dir, "dispatched.jsonl");
  fault.failAppends = 0;
  fault.failTruncates = 0;
});
afterEach(async () => {
  fault.log = undefined;
  await rm(dir, { recursive: true, force: true });
});

const lines = async () => (await readFile(fault.log!, "utf8")).split("\n");

describe("dispatch log: a failed append", () => {
  it("is cut back to the last good length, so the next append and the next start's read find whole lines only", async () => {
    const log = await DispatchLog.create(fault.log!, "run-1");
    await log.record({ rollout_id: "a", attempt: 0 });
    fault.failAppends = 1;
    await expect(log.record({ rollout_id: "b", attempt: 0 })).rejects.toMatchObject({ code: "ENOSPC" });
    await log.record({ rollout_id: "c", attempt: 0 });
    expect(await lines()).toEqual(['{"run_id":"run-1"}', '{"rollout_id":"a","attempt":0}', '{"rollout_id":"c","attempt":0}', ""]);
    const history = await DispatchLog.read(fault.log!);
    expect([...history!.latest]).toEqual([
      ["a", 0],
      ["c", 0],
    ]);
  });

  it("whose cut failed too is cut before the next append", async () => {
    const log = await DispatchLog.create(fault.log!, "run-1");
    fault.failAppends = 1;
    fault.failTruncates = 1;
    await expect(log.record({ rollout_id: "b", attempt: 0 })).rejects.toMatchObject({ code: "ENOSPC" });
    await log.record({ rollout_id: "c", attempt: 1 });
    expect(await lines()).toEqual(['{"run_id":"run-1"}', '{"rollout_id":"c","attempt":1}', ""]);
  });
});
