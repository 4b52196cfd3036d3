import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { z } from "zod";
import { SANDBOX_CHILD_SOURCE } from "./sandbox-child-source.js";

/**
 * Limits of one sandboxed run. The child is a separate node process with:
 *   - `--max-old-space-size` (heap limit; off-heap allocators are removed inside the context),
 *   - a per-case `vm` timeout (sync code and microtasks) and a wall-clock SIGKILL for the whole run,
 *   - an empty environment, a fresh temporary working directory, and Node's permission model
 *     (no fs, child processes, workers or addons),
 *   - the submission evaluated in a null-prototype `vm` context, so `require`/`process` are absent.
 * `vm` alone is not a security boundary; the process, its permission flags and the limits are.
 * This is no substitute for an OS sandbox (containers, seccomp) for adversarial workloads.
 */
export interface SandboxLimits {
  memoryMb: number;
  caseTimeoutMs: number;
  /** Added to the wall clock for process start-up. */
  startupMs: number;
  maxOutputBytes: number;
}

export const DEFAULT_SANDBOX_LIMITS: SandboxLimits = { memoryMb: 64, caseTimeoutMs: 1000, startupMs: 3000, maxOutputBytes: 1024 * 1024 };

export type SandboxJob =
  | { mode: "function"; code: string; function_name: string; cases: { args: unknown[] }[] }
  | { mode: "stdio"; code: string; cases: { input: string }[] };

const CaseResultSchema = z.discriminatedUnion("status", [
  z.object({ status: z.literal("ok"), output: z.string() }).strict(),
  z.object({ status: z.literal("error"), error: z.string() }).strict(),
  z.object({ status: z.literal("timeout") }).strict(),
]);
export type CaseResult = z.infer<typeof CaseResultSchema>;
const ChildOutputSchema = z.object({ results: z.array(CaseResultSchema) }).strict();

/** `completed`: every case ran (each with its own status); otherwise the whole run was stopped. */
export type SandboxOutcome =
  | { status: "completed"; results: CaseResult[] }
  | { status: "timeout" | "memory_limit" | "output_limit" | "crashed"; detail: string };

const permissionFlag = process.allowedNodeEnvironmentFlags.has("--permission") ? "--permission" : "--experimental-permission";

export async function runSandboxed(job: SandboxJob, limits: SandboxLimits = DEFAULT_SANDBOX_LIMITS): Promise<SandboxOutcome> {
  const cwd = await mkdtemp(join(tmpdir(), "gym-ckpt-sandbox-"));
  try {
    return await new Promise<SandboxOutcome>((resolve) => {
      const child = spawn(
        process.execPath,
        [permissionFlag, "--no-warnings", `--max-old-space-size=${limits.memoryMb}`, "-e", SANDBOX_CHILD_SOURCE],
        { cwd, env: {}, stdio: ["pipe", "pipe", "pipe"] },
      );
      let stdout = "";
      let stderr = "";
      let stopped: SandboxOutcome | undefined;
      const stop = (outcome: SandboxOutcome) => {
        stopped ??= outcome;
        child.kill("SIGKILL");
      };
      const wallMs = limits.startupMs + limits.caseTimeoutMs * Math.max(1, job.cases.length);
      const timer = setTimeout(() => stop({ status: "timeout", detail: `wall clock of ${wallMs} ms exceeded` }), wallMs);
      child.stdout.setEncoding("utf8");
      child.stderr.setEncoding("utf8");
      child.stdout.on("data", (chunk: string) => {
        stdout += chunk;
        if (stdout.length > limits.maxOutputBytes) stop({ status: "output_limit", detail: `more than ${limits.maxOutputBytes} bytes of output` });
      });
      child.stderr.on("data", (chunk: string) => {
        if (stderr.length < 64 * 1024) stderr += chunk;
      });
      child.stdin.on("error", () => undefined);
      child.on("error", (error) => stop({ status: "crashed", detail: error.message }));
      child.on("close", (code, signal) => {
        clearTimeout(timer);
        if (stopped) return resolve(stopped);
        if (/heap limit|out of memory|allocation failed/i.test(stderr)) {
          return resolve({ status: "memory_limit", detail: `heap limit of ${limits.memoryMb} MB reached` });
        }
        if (code !== 0) return resolve({ status: "crashed", detail: `exit ${code ?? signal}: ${stderr.slice(0, 300)}` });
        try {
          const parsed = ChildOutputSchema.parse(JSON.parse(stdout.trim()));
          if (parsed.results.length !== job.cases.length) return resolve({ status: "crashed", detail: "case count mismatch" });
          resolve({ status: "completed", results: parsed.results });
        } catch {
          resolve({ status: "crashed", detail: "unreadable child output" });
        }
      });
      child.stdin.end(JSON.stringify({ ...job, case_timeout_ms: limits.caseTimeoutMs }));
    });
  } finally {
    await rm(cwd, { recursive: true, force: true });
  }
}
