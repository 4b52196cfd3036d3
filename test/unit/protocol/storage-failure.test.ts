import { mkdir, mkdtemp, open, rm, writeFile } from "node:fs/promises";
import { createServer, connect, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointError, ERROR_CATALOG, isStorageFailure, namePath, toCheckpointError } from "../../../protocol/index.js";

/** What `work` throws (or rejects with); fails the test when it succeeds. */
async function thrown(work: () => Promise<unknown>): Promise<Error> {
  try {
    await work();
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a failure");
}

/** The error of a TCP or unix-socket connect that fails. */
function connectError(options: { port: number; host: string } | { path: string }): Promise<Error> {
  return new Promise((resolve, reject) => {
    const socket = connect(options as never);
    socket.once("connect", () => {
      socket.destroy();
      reject(new Error("expected the connect to fail"));
    });
    socket.once("error", resolve);
  });
}

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-storage-failure-"));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

describe("toCheckpointError: file-system failures are storage_error", () => {
  it("an ENOSPC from a write (/dev/full, a full disk for root too) is storage_error, naming the error, the call and (with namePath) the file", async () => {
    const handle = await open("/dev/full", "w");
    const error = await thrown(() => handle.write(Buffer.from("x"))).finally(() => handle.close());
    const refusal = toCheckpointError(error);
    expect([refusal.code, refusal.message]).toEqual(["storage_error", "ENOSPC: no space left on device, write"]);
    expect(refusal.status).toBe(507);
    expect(refusal.cause).toBe(error);
    // A handle's errors name no path; the writer adds the one it opened.
    expect(toCheckpointError(namePath(error, "/ckpt/c1/.records.jsonl.1")).message).toBe("ENOSPC: no space left on device, write '/ckpt/c1/.records.jsonl.1'");
  });

  it("a directory that cannot exist there (mkdir under a regular file: ENOTDIR, for root too) is storage_error; Node's message already names the path", async () => {
    const file = join(dir, "a-file");
    await writeFile(file, "x");
    const error = await thrown(() => mkdir(join(file, "c1")));
    const refusal = toCheckpointError(namePath(error, "/elsewhere")); // a path Node set is kept
    expect([refusal.code, refusal.message]).toEqual(["storage_error", `ENOTDIR: not a directory, mkdir '${join(file, "c1")}'`]);
  });

  it("a socket's failure stays what it was, even with an errno name storage failures share: ECONNREFUSED, a unix socket's ENOENT", async () => {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    await new Promise((resolve) => server.close(resolve)); // nobody listens there now
    const refused = await connectError({ port, host: "127.0.0.1" });
    expect((refused as NodeJS.ErrnoException).code).toBe("ECONNREFUSED");
    const noSocket = await connectError({ path: join(dir, "absent.sock") });
    expect((noSocket as NodeJS.ErrnoException).code).toBe("ENOENT");
    for (const error of [refused, noSocket]) {
      expect(isStorageFailure(error)).toBe(false);
      expect([toCheckpointError(error).code, toCheckpointError(error).message]).toEqual(["internal_error", error.message]);
    }
  });

  it("a plain Error, one with only an errno name, and anything not an Error are internal_error; a CheckpointError is itself", () => {
    const plain = new Error("ENOSPC: no space left on device, write");
    const codeOnly = Object.assign(new Error("ENOSPC"), { code: "ENOSPC" }); // no syscall: not Node's fs
    for (const error of [plain, codeOnly, "ENOSPC"]) {
      expect(toCheckpointError(error).code).toBe("internal_error");
      expect(namePath(error, "/x")).toBe(error);
    }
    expect(codeOnly).not.toHaveProperty("path");
    const refusal = new CheckpointError("stale_epoch", "old");
    expect(toCheckpointError(refusal)).toBe(refusal);
  });

  it("is in the catalog as 507 with a detail that names the system error and the path", () => {
    expect(ERROR_CATALOG.storage_error.status).toBe(507);
    expect(ERROR_CATALOG.storage_error.meaning).toMatch(/names the system error, the call and the path/);
  });
});
