import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { z } from "zod";
import { SANDBOX_CHILD_SOURCE } from "./sandbox-child-source.js";
import { SANDBOX_SLOTS } from "./sandbox-slots.js";

/**
 * Limits of one sandboxed run. The child is a separate node process with:
 *   - `--max-old-space-size` (heap limit; off-heap allocators are removed inside the context), a
 *     resident-memory limit this process watches, and a kernel data-segment limit (RLIMIT_DATA),
 *   - a per-case `vm` timeout (sync code and microtasks), a wall-clock SIGKILL for the whole run
 *     and a kernel CPU-time limit (RLIMIT_CPU) that holds even if this process dies,
 *   - an empty environment, `/` as working directory (nothing is created per run: a directory
 *     removed after the run outlived a verifier that exited first), and Node's permission model
 *     (no fs, child processes, workers or addons),
 *   - the submission evaluated in a null-prototype `vm` context that holds no host object.
 * `vm` alone is not a security boundary; the process, its permission flags and the limits are.
 * This is no substitute for an OS sandbox (containers, seccomp) for adversarial workloads.
 */
export interface SandboxLimits {
  /** V8 heap limit (`--max-old-space-size`). */
  memoryMb: number;
  /**
   * Resident memory (VmRSS) of the whole child, sampled every RESIDENT_SAMPLE_MS; above it the
   * child is killed as `memory_limit`. Default: memoryMb + RESIDENT_OVERHEAD_MB (node itself, its
   * young generation and code take ~100 MB beside the old-space heap).
   */
  residentMb?: number;
  caseTimeoutMs: number;
  /** For node to start (until the child is ready), and again as slack on top of the cases' time. */
  startupMs: number;
  /** Longest output of one case (characters); a case that produces more ends as `output_limit`. */
  maxCaseOutputChars: number;
}

export const DEFAULT_SANDBOX_LIMITS: SandboxLimits = { memoryMb: 64, caseTimeoutMs: 1000, startupMs: 3000, maxCaseOutputChars: 64 * 1024 };
/** What the child may hold beyond its heap limit before the resident-memory watch kills it. */
export const RESIDENT_OVERHEAD_MB = 160;
/** How often the verifier reads a child's VmRSS. */
export const RESIDENT_SAMPLE_MS = 20;

export type SandboxJob =
  | { mode: "function"; code: string; function_name: string; cases: { args: unknown[] }[] }
  | { mode: "stdio"; code: string; cases: { input: string }[] };

const CaseResultSchema = z.discriminatedUnion("status", [
  z.object({ status: z.literal("ok"), output: z.string() }).strict(),
  z.object({ status: z.literal("error"), error: z.string() }).strict(),
  z.object({ status: z.literal("timeout") }).strict(),
  z.object({ status: z.literal("output_limit") }).strict(),
]);
export type CaseResult = z.infer<typeof CaseResultSchema>;
const ChildOutputSchema = z.object({ results: z.array(CaseResultSchema) }).strict();

/** `completed`: every case ran (each with its own status); otherwise the whole run was stopped. */
export type SandboxOutcome =
  | { status: "completed"; results: CaseResult[] }
  | { status: "timeout" | "memory_limit" | "output_limit" | "crashed"; detail: string };

const permissionFlag = process.allowedNodeEnvironmentFlags.has("--permission") ? "--permission" : "--experimental-permission";
// --experimental-vm-modules lets the child answer import() with an error of the submission's own realm.
// A submission can always reach some host-realm value: Node's stack-trace and import callbacks are
// host-realm functions, and called with the stack all but used up they throw a host-realm RangeError.
// So the child's own realm is made inert: --disallow-code-generation-from-strings (its Function and
// eval compile nothing, so `process`, `require` and its import() stay out of reach; the submission's
// context allows strings for itself) and --frozen-intrinsics (no getter put on its Object.prototype
// runs submission code inside the child's own code, untimed).
const NODE_FLAGS = [permissionFlag, "--experimental-vm-modules", "--disallow-code-generation-from-strings", "--frozen-intrinsics", "--no-warnings"];

/**
 * A JSON value as JavaScript source that evaluates to the same value, for the child to call the
 * function with (`f(...<source>)`). Not JSON.stringify's text: that writes -0 as `0`, and in an
 * object literal a `"__proto__": {…}` member sets the object's prototype instead of making the own
 * property JSON.parse made, so a task's argument would reach the function as another value.
 */
export function literal(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(literal).join(",")}]`;
  if (Object.is(value, -0)) return "-0";
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  const object = value as Record<string, unknown>;
  return `{${Object.keys(object).map((key) => `${key === "__proto__" ? '["__proto__"]' : JSON.stringify(key)}:${literal(object[key])}`).join(",")}}`;
}

/** The job line the child reads: a function's arguments as source text (literal), the rest as JSON. */
function childJob(job: SandboxJob): object {
  return job.mode === "function" ? { ...job, cases: job.cases.map((c) => ({ args_source: literal(c.args) })) } : job;
}

/** Children of runs in flight, so a shutting-down verifier can end them. */
const liveChildren = new Set<ChildProcess>();
let exitHookInstalled = false;

/** SIGKILLs every running sandbox child; their runs end as `crashed`. For a verifier's shutdown. */
export function stopSandboxes(): void {
  for (const child of liveChildren) child.kill("SIGKILL");
}

/** How many sandbox children are running right now (status and tests). */
export function liveSandboxes(): number {
  return liveChildren.size;
}

/** Resident memory of a process in KiB (Linux /proc), or undefined if it cannot be read. */
function residentKb(pid: number): number | undefined {
  try {
    const match = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return match ? Number(match[1]) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Starts node under `sh` so the kernel enforces a CPU-time limit (soft: SIGXCPU, then hard:
 * SIGKILL) and a data-segment limit, and no core dump is written: the child ends by itself even
 * if this process is SIGKILLed. Fails closed: if a limit cannot be set, the child never starts.
 */
function spawnChild(cpuSeconds: number, dataMb: number, nodeArgs: string[]): ChildProcess {
  const limits = `ulimit -c 0 && ulimit -d ${dataMb * 1024} && ulimit -S -t ${cpuSeconds} && ulimit -H -t ${cpuSeconds + 1} && exec "$0" "$@"`;
  return spawn("/bin/sh", ["-c", limits, process.execPath, ...nodeArgs], { cwd: "/", env: {}, stdio: ["pipe", "pipe", "pipe"] });
}

/**
 * Runs a job in a sandbox child. At most one child per CPU runs at once (SANDBOX_SLOTS); a run
 * waiting for a slot is not timed. The run's wall clock starts when the child reports ready, so
 * node's start-up is not counted against the submission. `signal` aborting (a retire of the
 * request) takes a waiting run out of the queue or kills its child, and rejects with its reason.
 */
export async function runSandboxed(job: SandboxJob, limits: SandboxLimits = DEFAULT_SANDBOX_LIMITS, signal?: AbortSignal): Promise<SandboxOutcome> {
  // A missing limit (say, an old `maxOutputBytes` object from plain JavaScript) would silently mean none.
  for (const name of [...Object.keys(DEFAULT_SANDBOX_LIMITS), ...(limits.residentMb === undefined ? [] : ["residentMb"])] as (keyof SandboxLimits)[]) {
    const value = limits[name];
    if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) throw new Error(`sandbox limit ${name} must be a positive number`);
  }
  const outcome = await SANDBOX_SLOTS.run(() => runInChild(job, limits, signal), signal);
  signal?.throwIfAborted();
  return outcome;
}

async function runInChild(job: SandboxJob, limits: SandboxLimits, signal: AbortSignal | undefined): Promise<SandboxOutcome> {
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.once("exit", stopSandboxes);
  }
  return new Promise<SandboxOutcome>((resolve) => {
    const runMs = limits.caseTimeoutMs * Math.max(1, job.cases.length) + limits.startupMs;
    // A backstop well above the wall clock (V8's helper threads count too), not a second verdict.
    const cpuSeconds = Math.ceil((2 * (limits.startupMs + runMs)) / 1000) + 1;
    // JSON escaping can grow a character to six; an error detail is at most 500 characters.
    const maxStdout = 64 * 1024 + Math.max(1, job.cases.length) * 6 * (limits.maxCaseOutputChars + 600);
    const residentMb = limits.residentMb ?? limits.memoryMb + RESIDENT_OVERHEAD_MB;
    // A kernel backstop for the resident watch (between two samples, or once this process is
    // gone): writable mappings include reserved thread stacks, so it sits well above residentMb.
    const dataMb = Math.ceil(2 * residentMb + 256);
    let child: ChildProcess;
    try {
      child = spawnChild(cpuSeconds, dataMb, [...NODE_FLAGS, `--max-old-space-size=${limits.memoryMb}`, "-e", SANDBOX_CHILD_SOURCE]);
    } catch (error) {
      return resolve({ status: "crashed", detail: `the sandbox could not start: ${error instanceof Error ? error.message : String(error)}` });
    }
    let stdout = "";
    let stderr = "";
    let ready = false;
    let stopped: SandboxOutcome | undefined;
    let settled = false;
    const stop = (outcome: SandboxOutcome) => {
      stopped ??= outcome;
      child.kill("SIGKILL");
    };
    let timer: NodeJS.Timeout | undefined;
    let watch: NodeJS.Timeout | undefined;
    const onAbort = () => stop({ status: "crashed", detail: "stopped: its request was retired" });
    const settle = (outcome: SandboxOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      clearInterval(watch);
      signal?.removeEventListener("abort", onAbort);
      liveChildren.delete(child);
      child.stdin?.destroy();
      resolve(outcome);
    };
    // First, before anything that can throw: a spawn that failed (EMFILE, ENOENT, ...) reports
    // here, and an 'error' nobody listens to would end this whole process.
    child.on("error", (error) => {
      // Never started: no 'close' follows.
      if (child.pid === undefined) settle({ status: "crashed", detail: `the sandbox could not start: ${error.message}` });
      else stop({ status: "crashed", detail: error.message });
    });
    const { stdin, stdout: out, stderr: err } = child;
    // Out of file descriptors, node gives the child no pipes (and reports EMFILE next).
    if (child.pid === undefined || !stdin || !out || !err) {
      // Never kill() a child that has no pid: node keeps its handle with pid 0 after EMFILE, and
      // kill(0) would SIGKILL this whole process group (the verifier, and whatever started it).
      if (child.pid !== undefined) child.kill("SIGKILL");
      return settle({ status: "crashed", detail: "the sandbox could not start: no process or no pipes (out of file descriptors?)" });
    }
    liveChildren.add(child);
    timer = setTimeout(() => stop({ status: "crashed", detail: `the sandbox did not start within ${limits.startupMs} ms` }), limits.startupMs);
    // The heap limit does not bound what V8 and ICU keep outside the heap: watch the whole process.
    watch = setInterval(() => {
      const kb = residentKb(child.pid!);
      if (kb !== undefined && kb > residentMb * 1024) stop({ status: "memory_limit", detail: `resident memory above ${residentMb} MB` });
    }, RESIDENT_SAMPLE_MS);
    out.setEncoding("utf8");
    err.setEncoding("utf8");
    out.on("data", (chunk: string) => {
      if (stopped) return;
      stdout += chunk;
      if (stdout.length > maxStdout) return stop({ status: "output_limit", detail: `more than ${maxStdout} characters of output` });
      if (ready || !stdout.includes("\n")) return;
      if (!stdout.startsWith("ready\n")) return stop({ status: "crashed", detail: "the sandbox did not report ready" });
      ready = true;
      stdout = stdout.slice("ready\n".length);
      clearTimeout(timer);
      timer = setTimeout(() => stop({ status: "timeout", detail: `wall clock of ${runMs} ms exceeded` }), runMs);
      // stdin stays open until the child ends: its end tells the child that this process is gone.
      stdin.write(`${JSON.stringify({ ...childJob(job), case_timeout_ms: limits.caseTimeoutMs, max_case_output_chars: limits.maxCaseOutputChars })}\n`);
    });
    err.on("data", (chunk: string) => {
      if (stderr.length < 64 * 1024) stderr += chunk;
    });
    stdin.on("error", () => undefined);
    if (signal?.aborted) onAbort();
    else signal?.addEventListener("abort", onAbort, { once: true });
    child.on("close", (code, killedBy) => {
      if (stopped) return settle(stopped);
      if (/heap limit|out of memory|allocation failed/i.test(stderr)) {
        return settle({ status: "memory_limit", detail: `heap limit of ${limits.memoryMb} MB reached` });
      }
      // An allocation refused at the data-segment limit, where ICU does not check for it.
      if (killedBy === "SIGSEGV") return settle({ status: "memory_limit", detail: `data-segment limit of ${dataMb} MB reached (SIGSEGV)` });
      if (killedBy === "SIGXCPU") return settle({ status: "timeout", detail: `CPU time limit of ${cpuSeconds} s reached` });
      if (code !== 0 || !ready) return settle({ status: "crashed", detail: `exit ${code ?? killedBy}: ${stderr.slice(0, 300)}` });
      try {
        const parsed = ChildOutputSchema.parse(JSON.parse(stdout.trim()));
        if (parsed.results.length !== job.cases.length) return settle({ status: "crashed", detail: "case count mismatch" });
        settle({ status: "completed", results: parsed.results });
      } catch {
        settle({ status: "crashed", detail: "unreadable child output" });
      }
    });
  });
}
