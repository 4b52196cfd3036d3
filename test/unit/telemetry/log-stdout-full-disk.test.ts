import { spawn } from "node:child_process";
import { openSync, closeSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

// A daemon's stdout redirected to a log file on the disk that fills (`gym-ckpt coordinator >
// /var/log/gym-ckpt.log`, often the checkpoint root's disk). pino's stdout stream re-raised the
// write's ENOSPC as an uncaught exception, and the process's exit then ran pino's exit-time
// flushSync, which retries any error but EAGAIN for ever: the process hung in it with its event
// loop blocked (no lease renewed, SIGTERM ignored, never restarted by a supervisor). /dev/full
// fails every write with ENOSPC, for root too.

const LOGGERS = {
  coordinator: fileURLToPath(new URL("../../../coordinator/telemetry/logger.ts", import.meta.url)),
  shared: fileURLToPath(new URL("../../../protocol/stdout-log-refusal.ts", import.meta.url)),
};

/**
 * Runs `program` with stdout on /dev/full; resolves with its exit code and stderr, or "hung" (the
 * defect hung for ever; the bound leaves room for a loaded machine's tsx start-up, seconds).
 */
function runOnFullStdout(program: string, timeoutMs = 20_000): Promise<{ code: number | null; stderr: string } | "hung"> {
  const full = openSync("/dev/full", "w");
  try {
    const child = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", program], {
      stdio: ["ignore", full, "pipe"],
      env: { ...process.env, OTEL_SDK_DISABLED: "true" },
    });
    let stderr = "";
    child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        child.kill("SIGKILL");
        resolve("hung");
      }, timeoutMs);
      child.on("exit", (code) => {
        clearTimeout(timer);
        resolve({ code, stderr });
      });
    });
  } finally {
    closeSync(full);
  }
}

/**
 * Logs, waits until the failed write was reported on stderr (at most 5 s: past that the warning
 * count below fails the test), logs again, then exits 0 as a stopping daemon does.
 */
const body = `
  const warned = new Promise((resolve) => {
    const write = process.stderr.write.bind(process.stderr);
    process.stderr.write = (chunk, ...rest) => {
      if (String(chunk).includes("storage_error")) resolve();
      return write(chunk, ...rest);
    };
  });
  for (let i = 0; i < 3; i++) logger.info({ i, pad: "x".repeat(20000) }, "line");
  await Promise.race([warned, new Promise((resolve) => setTimeout(resolve, 5000))]);
  logger.info("after the failure");
  process.stderr.write("still running\\n");
  process.exit(0);
`;

describe("logs on stdout that the storage refuses (ENOSPC)", () => {
  it("the coordinator's logger drops them and the process keeps running and exits as asked", async () => {
    const result = await runOnFullStdout(`import { createLogger } from ${JSON.stringify(LOGGERS.coordinator)};
      const logger = createLogger("info");${body}`);
    expect(result).not.toBe("hung");
    if (result === "hung") return;
    expect(result.stderr).toContain("still running");
    expect(result.stderr.match(/warning storage_error: ENOSPC: no space left on device, write \(standard output\): the logs that follow are dropped\n/g)).toHaveLength(1);
    expect(result.code).toBe(0);
  }, 40_000);

  it("a participant program's logger (server-runtime's destination) does the same", async () => {
    const result = await runOnFullStdout(`import pino from "pino";
      import { endLogsWhenStdoutRefuses } from ${JSON.stringify(LOGGERS.shared)};
      const logger = pino({}, endLogsWhenStdoutRefuses(pino.destination({ dest: 1 }), "test-server: "));${body}`);
    expect(result).not.toBe("hung");
    if (result === "hung") return;
    expect(result.stderr).toContain("still running");
    expect(result.stderr.match(/test-server: warning storage_error: ENOSPC: no space left on device, write \(standard output\): the logs that follow are dropped\n/g)).toHaveLength(1);
    expect(result.code).toBe(0);
  }, 40_000);
});
