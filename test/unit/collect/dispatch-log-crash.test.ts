import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";

/**
 * A crash inside `DispatchLog.create`, simulated as the process dying halfway through its first
 * data write (in place or to a temp file): the previous log must survive whole.
 */
const crash = vi.hoisted(() => ({ under: undefined as string | undefined }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const armed = (path: unknown) => crash.under !== undefined && String(path).startsWith(crash.under);
  const half = (data: unknown) => (typeof data === "string" ? data.slice(0, data.length / 2) : (data as Uint8Array).subarray(0, (data as Uint8Array).byteLength / 2));
  const writeFile: typeof real.writeFile = async (path, data, options) => {
    if (!armed(path)) return real.writeFile(path, data, options);
    await real.writeFile(path, half(data) as string, options);
    throw new Error("simulated crash mid-write");
  };
  const open: typeof real.open = async (path, flags, mode) => {
    const handle = await real.open(path, flags, mode);
    if (!armed(path)) return handle;
    return handleWith(handle, {
      writeFile: async (data: string | Uint8Array) => {
        await handle.writeFile(half(data) as string);
        throw new Error("simulated crash mid-write");
      },
    });
  };
  return withOverrides(real, { writeFile, open });
});

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-dispatch-crash-"));
});
afterEach(async () => {
  crash.under = undefined;
  await rm(dir, { recursive: true, force: true });
});

describe("dispatch log", () => {
  it("keeps the previous log whole when the process dies while create rewrites it", async () => {
    const path = join(dir, "dispatched.jsonl");
    const carried = Array.from({ length: 50 }, (_, i) => ({ rollout_id: `row-${i}`, attempt: i % 3 }));
    await DispatchLog.create(path, "run-1", carried);
    crash.under = dir;
    await expect(DispatchLog.create(path, "run-2", carried)).rejects.toThrow("simulated crash");
    crash.under = undefined;
    const history = await DispatchLog.read(path);
    expect(history?.runId).toBe("run-1");
    expect(Object.fromEntries(history!.latest)).toEqual(Object.fromEntries(carried.map((e) => [e.rollout_id, e.attempt])));
  });
});
