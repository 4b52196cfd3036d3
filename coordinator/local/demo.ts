import { randomBytes } from "node:crypto";
import { createWriteStream, type WriteStream } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseCaptureKey } from "../../protocol/index.js";
import { readResults } from "../collect/results-file.js";
import { CheckpointCatalog } from "../publication/checkpoint-catalog.js";
import { startChildProgram, type ChildProgram, type ChildProgramOptions } from "./child-program.js";
import { NatsServerProcess } from "./nats-server-process.js";
import { ignoreSigusr1Env, participantEntry } from "./participant-entry.js";
import { readableLogLine } from "./readable-log-line.js";

export interface DemoOptions {
  rows: number;
  concurrency: number;
  /** Seconds between the collector's timer checkpoints. */
  checkpointEvery: number;
  /** Share of rows finished before the crash. */
  crashAfter: number;
  tokenDelayMs: number;
  keep: boolean;
  /** Bound on the restarted collection (default 180 s). */
  finishTimeoutMs?: number;
  say: (line: string) => void;
  /** Aborting ends the run early: every process is killed and the work directory removed, then runDemo rejects. */
  signal?: AbortSignal;
}

export interface BackendCall {
  capture_key: string | null;
  model_call_id: string | null;
  /** The cut call this one continues (its generated prefix is reused, not generated again). */
  continued_from: string | null;
  message_count: number;
  delivered: boolean;
  /** The caller went away before the response was fully written. */
  aborted: boolean;
  tokens_emitted: number;
}

export interface DemoOutcome {
  ok: boolean;
  finished: number;
  rows: number;
  repeatedDeliveredCalls: number;
}

const DEPLOYMENT = "demo";

/**
 * The README's first command: a whole local run. nats-server, a coordinator daemon, the reference
 * Gym and a rollout collection; periodic checkpoints; then the collector and every Gym process are
 * SIGKILLed mid-run, started again, and the collection continues from the last checkpoint. The
 * fake policy backend plays the inference server that survives a Gym crash, so its call log can
 * prove that no delivered model call was made twice.
 */
export async function runDemo(options: DemoOptions): Promise<DemoOutcome> {
  const { say, signal } = options;
  const aborted = () => new Error("demo aborted");
  if (signal?.aborted) throw aborted();
  const work = await mkdtemp(join(tmpdir(), "gym-ckpt-demo-"));
  const root = join(work, "checkpoints");
  const token = randomBytes(16).toString("hex");
  const cli = fileURLToPath(new URL(`../cli/main${import.meta.url.endsWith(".ts") ? ".ts" : ".js"}`, import.meta.url));
  const children: ChildProgram[] = [];
  // Starts still waiting for a ready line: clean-up waits for them (the abort ends them), so no process outlives it.
  const starting = new Set<Promise<unknown>>();
  let nats: NatsServerProcess | undefined;
  let natsStart: Promise<NatsServerProcess> | undefined;
  const launch = async (script: string, args: string[], opts?: ChildProgramOptions): Promise<ChildProgram> => {
    if (signal?.aborted) throw aborted();
    // One inherited Prometheus port would make every demo process bind the same one. Each program
    // stops once the demo is gone, even SIGKILLed (when the clean-up below never runs).
    // The token travels in the environment, as docs/operations.md asks of every deployment: any
    // local user can read a command line (/proc/<pid>/cmdline). One token serves participants and
    // controllers alike; a controller token inherited from the shell would not match the daemon's.
    const env = { ...opts?.env, OTEL_EXPORTER_PROMETHEUS_PORT: undefined, GYM_CKPT_TOKEN: token, GYM_CKPT_CONTROLLER_TOKEN: undefined };
    // The abort ends a start still waiting for its ready line at once (the program killed), so the
    // clean-up below never waits for a Gym that cannot get ready once a Ctrl-C stopped nats-server.
    const pending = startChildProgram(script, args, { ...opts, exitWithParent: true, env, ...(signal && { signal }) });
    starting.add(pending);
    try {
      const child = await pending;
      children.push(child);
      if (signal?.aborted) throw aborted();
      return child;
    } finally {
      starting.delete(pending);
    }
  };
  // With --keep, the Gym's and the backend's own lines go to files in the work directory (the
  // console shows only the demo's, the coordinator's and the collector's): what a failed verdict is read against.
  const logs: WriteStream[] = [];
  const logFile = (name: string): ((line: string) => void) | undefined => {
    if (!options.keep) return undefined;
    const stream = createWriteStream(join(work, name), { flags: "a" });
    stream.on("error", (error) => say(`cannot write ${name}: ${error.message}`));
    logs.push(stream);
    return (line) => stream.write(`${line}\n`);
  };
  const abortion = new Promise<never>((_, reject) => signal?.addEventListener("abort", () => reject(aborted()), { once: true }));
  const run = async (): Promise<DemoOutcome> => {
    await mkdir(root);
    // An abort during the mkdir already ran the clean-up (it found no nats-server to dispose of):
    // one started now would run on and leave its store directory behind.
    if (signal?.aborted) throw aborted();
    natsStart = NatsServerProcess.start({ exitWithParent: true });
    nats = await natsStart;
    say(`nats-server (JetStream) on ${nats.url}`);
    const common = ["--nats-url", nats.url, "--deployment", DEPLOYMENT];

    await launch(cli, ["coordinator", ...common, "--checkpoint-root", root, "--lease-ms", "1000", "--no-http", "--log-level", "warn"], {
        onLine: (line) => say(`  coordinator: ${readableLogLine(line)}`),
      });
    say("coordinator daemon started (it waits one lease period before it leads)");

    const backendLog = logFile("policy-backend.log");
    const backend = await launch(
      participantEntry("gym/policy-backend/main"),
      ["--nats", nats.url, "--deployment", DEPLOYMENT, "--instance", "policy_backend", "--port", "0", "--token-delay-ms", String(options.tokenDelayMs)],
      { waitReady: true, env: ignoreSigusr1Env(), ...(backendLog && { onLine: backendLog }) },
    );
    const backendUrl = String(backend.ready!.url);
    say(`fake policy backend (the inference server, outlives Gym crashes) on ${backendUrl}`);

    // Both Gym runs, before and after the crash, in one file; each line names its server (--verbose).
    const gymLog = logFile("gym.log");
    const startGym = async () => {
      const gym = await launch(
        participantEntry("gym/main"),
        ["--nats", nats!.url, "--deployment", DEPLOYMENT, "--checkpoint-root", root, "--lease-grace-seconds", "30", "--policy-url", backendUrl, ...(gymLog ? ["--verbose"] : [])],
        // TMPDIR = the work directory: the model attach proxy's default capture ledger
        // (<tmp>/gym-ckpt-ledger-<uid>/<deployment>/<instance>) would otherwise be shared by every demo
        // (same deployment, same capture keys demo-001…) and outlive it.
        { waitReady: true, group: true, env: { TMPDIR: work, ...ignoreSigusr1Env() }, ...(gymLog && { onLine: gymLog }) },
      );
      return { gym, urls: gym.ready!.urls as Record<string, string> };
    };
    let { gym, urls } = await startGym();
    say(`reference Gym up: model proxy ${urls.model}, resources ${urls.resources}, agent ${urls.agent}, environment ${urls.environment}`);

    const tasks = join(work, "tasks.jsonl");
    const out = join(work, "results.jsonl");
    await writeFile(tasks, demoTasks(options.rows));
    const collectArgs = () => [
      "collect",
      ...common,
      "--tasks",
      tasks,
      "--out",
      out,
      "--checkpoint-dir",
      root,
      "--run-url",
      `${urls.environment}/run`,
      "--concurrency",
      String(options.concurrency),
      "--checkpoint-every",
      String(options.checkpointEvery),
      "--checkpoint-timeout-s",
      "20",
      "--progress-interval-s",
      "2",
    ];
    const collectorOutput = (line: string) => say(`  collect: ${readableLogLine(line)}`);
    // The run's last model call is held from the start until the crash, so its row is unfinished at
    // the crash whatever --crash-after. The hold below keeps only responses not started yet, and is
    // armed a poll after the crash point: rows running in step (all in flight, near a run's end)
    // finished meanwhile, the collector ended without the crash checkpoint and the demo failed.
    const lastCallHeldAfter = options.rows * MODEL_CALLS_PER_ROW - 1;
    await postJson(`${backendUrl}/admin/hold`, { after: lastCallHeldAfter });
    say(`collecting ${options.rows} multi-turn rows, ${options.concurrency} at a time, a checkpoint every ${options.checkpointEvery} s`);
    let collector = await launch(cli, collectArgs(), { onLine: collectorOutput });

    // Let the run get going. No timer checkpoint is waited for: with a --checkpoint-every longer than
    // the run none comes before every row finished, and the SIGUSR1 checkpoint below is the crash's.
    const crashAt = Math.ceil(options.rows * options.crashAfter);
    await waitFor(async () => (await readResults(out)).size >= crashAt, 120_000, collector, "rows to finish before the crash");
    // Hold every response not yet started, so nothing is delivered after the last checkpoint. The
    // backend picks the cut-off as it arms the hold: with a count read here first, calls recorded
    // in between slipped past the hold unwatched, streamed across the crash checkpoint (which cut
    // them) and were delivered after its commit, so the restore legitimately generated them again.
    const { hold_after: holdAfter } = (await postJson(`${backendUrl}/admin/hold`, {})) as { hold_after: number };
    // The last call may be recorded already, waiting on the hold armed at the start: it is no response started before this one.
    const heldAfter = Math.min(holdAfter, lastCallHeldAfter);
    // Responses the backend began before the hold still stream. One the model proxy holds through a
    // timer checkpoint is delivered after that checkpoint's commit, so wait until all of them are in.
    // "In" means in the model proxy's capture ledger, not just written by the backend: a proxy slow
    // to read a response it had not started relaying when the crash checkpoint closed it holds it,
    // the checkpoint rightly records the call as unfinished, and the restore generates it again.
    await waitFor(
      async () => {
        const calls = (await backendCalls(backendUrl)).slice(0, heldAfter);
        return calls.every((c) => c.delivered || c.aborted) && (await inLedger(urls.model!, token, calls.filter((c) => c.delivered)));
      },
      60_000,
      collector,
      "responses started before the hold to reach the Gym",
    );
    const heldAt = Date.now() / 1000;
    const catalog = new CheckpointCatalog(root);
    collector.child.kill("SIGUSR1");
    // A checkpoint opened after the hold: a timer checkpoint already under way when it began may
    // publish first, and calls delivered after its commit would be lost work, not continued work.
    await waitFor(
      async () => {
        const id = await catalog.latest();
        return id !== null && (await catalog.get(id)).prepared_at >= heldAt;
      },
      60_000,
      collector,
      "the last checkpoint before the crash",
    );
    const latest = await catalog.latest();
    say(`checkpoint ${latest} published with ${(await readResults(out)).size}/${options.rows} rows done — now SIGKILL the collector and every Gym process`);
    await Promise.all([collector.kill("SIGKILL"), gym.kill("SIGKILL")]);
    // Released only once every held call's connection is gone: the Gym's leader has exited, but a
    // killed proxy's sockets may close later on a busy machine, and a release before that streams
    // the response into the dead proxy's socket buffer, which the backend would count as delivered.
    await waitFor(
      async () => (await backendCalls(backendUrl)).slice(heldAfter).every((c) => c.delivered || c.aborted),
      30_000,
      undefined,
      "the killed Gym's held calls to close",
    );
    await postJson(`${backendUrl}/admin/release`, {});

    say("starting the Gym and the collector again: restore, resume, continue");
    ({ gym, urls } = await startGym());
    // What the collector restores: LATEST now, which a timer checkpoint published in the moment
    // before the kill landed may have moved past the one named above.
    const restoredFrom = await catalog.latest();
    collector = await launch(cli, collectArgs(), { onLine: collectorOutput });
    const { code } = await Promise.race([
      collector.exited,
      delay(options.finishTimeoutMs ?? 180_000).then(() => {
        throw new Error(`the restarted collection did not finish within ${(options.finishTimeoutMs ?? 180_000) / 1000} s`);
      }),
    ]);

    const results = [...(await readResults(out)).values()];
    const rowCheck = await verifyRows(out, demoRowIds(options.rows));
    const finalCalls = await backendCalls(backendUrl);
    const verdict = verifyCalls(finalCalls);
    // Every call the backend saw, for whoever reads a kept work directory after a failed verdict.
    if (options.keep) await writeFile(join(work, "backend-calls.json"), `${JSON.stringify(finalCalls, null, 1)}\n`);
    const meanReward = results.length ? results.reduce((sum, r) => sum + r.reward, 0) / results.length : 0;
    const continued = results.filter((r) => r.continued).length;
    say("");
    say(`rows finished: ${results.length}/${options.rows} (collector exit code ${code}), mean reward ${meanReward.toFixed(3)}`);
    say(`rows continued from checkpoint ${restoredFrom}: ${continued}; rows that started over: ${results.filter((r) => !r.continued && r.attempt > 0).length}`);
    say(
      `model calls: ${verdict.delivered} delivered, ${verdict.keptByContinuation} of them (${verdict.tokensKept} tokens) made before the crash and kept by continuation; ` +
        `${verdict.reissued} undelivered calls re-issued; delivered calls repeated: ${verdict.repeated}`,
    );
    if (rowCheck.repeated || rowCheck.unknown) say(`results.jsonl: ${rowCheck.repeated} rows finished more than once, ${rowCheck.unknown} rows no task names`);
    const ok = code === 0 && rowCheck.missing === 0 && rowCheck.repeated === 0 && rowCheck.unknown === 0 && verdict.repeated === 0;
    say(ok ? "demo passed: every row finished and no delivered model call was repeated" : "demo FAILED");
    if (options.keep) say(`work directory kept: ${work} (checkpoints/, results.jsonl, backend-calls.json, gym.log, policy-backend.log)`);
    return { ok, finished: results.length, rows: options.rows, repeatedDeliveredCalls: verdict.repeated };
  };
  try {
    // An abort stops waiting for the run; the run itself can start nothing more (see launch).
    return await Promise.race([run(), abortion]);
  } finally {
    await Promise.allSettled([...starting]);
    await Promise.allSettled(children.map((c) => c.kill("SIGKILL")));
    await natsStart?.then((n) => n.dispose()).catch(() => undefined);
    await Promise.all(logs.map((stream) => new Promise((resolve) => stream.end(resolve))));
    if (!options.keep) await rm(work, { recursive: true, force: true });
  }
}

function demoRowIds(rows: number): string[] {
  return Array.from({ length: rows }, (_, i) => `demo-${String(i).padStart(3, "0")}`);
}

/**
 * Every line of results.jsonl against the tasks: each task's row once. readResults keeps one row
 * per id, so a row written twice (a finished row collected again) or one no task names would not
 * show in its count; the demo would call that run a success.
 */
export async function verifyRows(path: string, ids: string[]): Promise<{ finished: number; missing: number; repeated: number; unknown: number }> {
  const wanted = new Set(ids);
  const seen = new Set<string>();
  let repeated = 0;
  let unknown = 0;
  const text = await readFile(path, "utf8").catch((error: NodeJS.ErrnoException) => (error.code === "ENOENT" ? "" : Promise.reject(error)));
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    const id = (JSON.parse(line) as { rollout_id?: unknown }).rollout_id;
    if (typeof id !== "string" || !wanted.has(id)) unknown++;
    else if (seen.has(id)) repeated++;
    else seen.add(id);
  }
  return { finished: seen.size, missing: wanted.size - seen.size, repeated, unknown };
}

/** Tool rounds of every demo task; a row makes one model call more than it has rounds. */
const TOOL_ROUNDS = 2;
const MODEL_CALLS_PER_ROW = TOOL_ROUNDS + 1;

/** Arithmetic tasks that take two tool rounds each: three model calls per row. */
function demoTasks(rows: number): string {
  const ids = demoRowIds(rows);
  const lines: string[] = [];
  for (let i = 0; i < rows; i++) {
    const a = 3 + ((i * 7) % 41);
    const b = 2 + ((i * 13) % 29);
    const c = 1 + (i % 9);
    lines.push(JSON.stringify({ id: ids[i], task: { expression: `${a} * ${b} + ${c}`, tool_rounds: TOOL_ROUNDS } }));
  }
  return `${lines.join("\n")}\n`;
}

/**
 * Per rollout, a delivered call with the same conversation length as an earlier delivered call
 * would be work done twice, unless it continues that call: the crash checkpoint cut a generation
 * (the backend finished writing the cut response, but the Gym never got it) and the restore
 * generated only the rest, from the kept prefix. Calls of attempt 0 delivered before the crash and
 * continued by a later attempt are the work continuation kept.
 */
export function verifyCalls(calls: BackendCall[]) {
  const seen = new Map<string, Map<number, string | null>>();
  const attempts = new Map<string, number>();
  let repeated = 0;
  let delivered = 0;
  for (const call of calls) {
    const episode = call.capture_key ? parseCaptureKey(call.capture_key) : undefined;
    if (!episode) continue;
    attempts.set(episode.rollout_id, Math.max(attempts.get(episode.rollout_id) ?? 0, episode.attempt));
    if (!call.delivered) continue;
    delivered++;
    const byLength = seen.get(episode.rollout_id) ?? new Map<number, string | null>();
    if (byLength.has(call.message_count)) {
      const earlier = byLength.get(call.message_count);
      if (earlier === null || earlier === undefined || call.continued_from !== earlier) repeated++;
    }
    byLength.set(call.message_count, call.model_call_id);
    seen.set(episode.rollout_id, byLength);
  }
  let keptByContinuation = 0;
  let tokensKept = 0;
  let reissued = 0;
  for (const call of calls) {
    const episode = call.capture_key ? parseCaptureKey(call.capture_key) : undefined;
    if (!episode) continue;
    const finalAttempt = attempts.get(episode.rollout_id) ?? 0;
    if (call.delivered && episode.attempt < finalAttempt) {
      keptByContinuation++;
      tokensKept += call.tokens_emitted;
    }
    if (!call.delivered && episode.attempt < finalAttempt) reissued++;
  }
  return { delivered, repeated, keptByContinuation, tokensKept, reissued };
}

async function backendCalls(url: string): Promise<BackendCall[]> {
  const response = await fetch(`${url}/admin/calls`);
  return ((await response.json()) as { calls: BackendCall[] }).calls;
}

/** Every one of `calls` has its row in the model proxy's capture ledger (written once the Gym has the whole response). */
async function inLedger(proxyUrl: string, token: string, calls: BackendCall[]): Promise<boolean> {
  const byKey = new Map<string, string[]>();
  for (const c of calls) if (c.capture_key && c.model_call_id) byKey.set(c.capture_key, [...(byKey.get(c.capture_key) ?? []), c.model_call_id]);
  for (const [key, ids] of byKey) {
    const response = await fetch(`${proxyUrl}/ng-capture/v1/ledger/${encodeURIComponent(key)}`, { headers: { authorization: `Bearer ${token}` } });
    if (!response.ok) return false;
    const recorded = new Set(((await response.json()) as { records: { model_call_id: string }[] }).records.map((r) => r.model_call_id));
    if (!ids.every((id) => recorded.has(id))) return false;
  }
  return true;
}

async function postJson(url: string, body: unknown): Promise<unknown> {
  const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  if (!response.ok) throw new Error(`${url} answered ${response.status}`);
  return response.json();
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

/** Polls a condition with a bounded budget; fails early if the watched process died. */
async function waitFor(condition: () => Promise<boolean>, timeoutMs: number, watched: ChildProgram | undefined, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await condition()) return;
    // A death by signal (the OOM killer's SIGKILL) leaves exitCode null: signalCode says it.
    if (watched && (watched.child.exitCode !== null || watched.child.signalCode !== null)) {
      throw new Error(`the collector exited (code ${watched.child.exitCode}, signal ${watched.child.signalCode}) while waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}
