import path from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import type { Logger } from "pino";
import type { z } from "zod";
import { compactionSeeds, recheckSeed, toolCallSeeds, type AnchorKind, type Seed } from "./anchors.js";
import { describeIssues, invalidRequest, ReplayError } from "./errors.js";
import { defaultLogger } from "./log.js";
import { expandGlobFiles } from "./record-glob.js";
import { isIndexFileName, stepOfPath } from "./record-paths.js";
import { addReadStats, newReadStats, readRecords, type ReadStats } from "./record-reader.js";
import {
  parseReplayConfig,
  recordFilters,
  recordPatterns,
  type ReplayConfig,
  type ReplayConfigInput,
} from "./replay-config.js";
import { fileIdentity, RetainedParses } from "./retained-parses.js";
import type { RandomFactory } from "./seeded-random.js";
import { completedFiles, isStepMarkerName } from "./step-marker.js";
import type { Prompt, TraceRecord } from "./trace-record.js";

/** Index files and step markers are never records, even when a broad glob matches them. */
function isRecordCandidate(file: string): boolean {
  const name = path.basename(file);
  return !isIndexFileName(name) && !isStepMarkerName(name);
}

/** The fields every task has; a source environment's typed task adds its own. */
export interface TaskShape {
  idx: number;
  name: string | null;
  prompt: Prompt | null;
}

/**
 * The environment whose finished rollouts are replayed. It owns the task type, tools, user
 * simulation and, above all, scoring: a replayed task is judged by the original verifier.
 */
export interface SourceEnvironment<T extends TaskShape = TaskShape, Rollout = unknown, Score = unknown> {
  readonly id: string;
  /** Validates a recorded task as this environment's typed task; a failure marks a foreign record. */
  readonly taskSchema: z.ZodType<T>;
  /** Narrows the `source` table of the replay config to this environment's own config. */
  readonly configSchema?: z.ZodType<unknown>;
  readonly tools?: readonly unknown[];
  readonly user?: unknown;
  readonly stops?: readonly string[];
  readonly stateType?: string;
  definesGroupRewards?(): boolean;
  /** Whether the source's tasks run in a container (a capability seam, like `tools`). */
  readonly needsContainer?: boolean;
  setup?(task: T): Promise<void> | void;
  restoreSnapshot?(task: T, ref: string): Promise<void> | void;
  /** Runs after generation, before scoring (e.g. collects the sandbox's final state). */
  finalize?(task: T, rollout: Rollout): Promise<void> | void;
  /** Whether a finished rollout is fit to be scored; absent means every rollout is. */
  validate?(task: T, rollout: Rollout): Promise<boolean> | boolean;
  score(task: T, rollout: Rollout): Promise<Score> | Score;
  scoreGroup?(tasks: readonly T[], rollouts: readonly Rollout[]): Promise<Score[]> | Score[];
}

/** Where a replayed task came from: enough to find the exact record and anchor again. */
export interface ReplayLineage {
  mode: ReplayConfig["mode"];
  anchor: AnchorKind;
  sourceEnv: string;
  sourceTraceId: string;
  sourceFile: string;
  sourceStep: number | null;
  /** Line position of the record in its file (0-based). */
  sourceOrdinal: number;
  sourceTaskIdx: number;
  sourceTaskName: string | null;
  anchorNode: number;
}

export interface ReplayTask<T extends TaskShape = TaskShape> {
  /** Replay-local position; stable for the life of the source (tasks are only ever appended). */
  readonly idx: number;
  readonly name: string;
  /** The seeded context. It is prompt, not completion: see seededContextNodes for loss masking. */
  readonly prompt: Prompt;
  /** The source's typed task with idx, name and prompt replaced; everything else (answers…) kept. */
  readonly task: T;
  readonly lineage: ReplayLineage;
  readonly snapshot: string | null;
  readonly seedTokens: number;
}

export type ReplaySkipReason = keyof ReadStats["skipped"] | "foreign" | "overlong";

export interface ReplayStats {
  read: ReadStats;
  /** Source-side skips, on top of read.skipped. */
  foreign: number;
  noSeed: number;
  overlong: number;
  indexFallbacks: number;
}

/**
 * How much a failed reload keeps of what it parsed, in record bytes parsed (an upper bound on what
 * the kept tasks hold): files past it are read again at the next reload.
 */
export const MAX_RETAINED_RELOAD_BYTES = 1024 * 1024 * 1024;

function newReplayStats(): ReplayStats {
  return { read: newReadStats(), foreign: 0, noSeed: 0, overlong: 0, indexFallbacks: 0 };
}

function addReplayStats(into: ReplayStats, from: ReplayStats): void {
  addReadStats(into.read, from.read);
  into.foreign += from.foreign;
  into.noSeed += from.noSeed;
  into.overlong += from.overlong;
  into.indexFallbacks += from.indexFallbacks;
}

/** One file's tasks renumbered from `base` (a file that sorts before it appeared since they were built). */
function rebased<T extends TaskShape>(tasks: readonly ReplayTask<T>[], base: number): ReplayTask<T>[] {
  return tasks.map((task, i) => Object.freeze({ ...task, idx: base + i, task: { ...task.task, idx: base + i } }));
}

/** One file's part of a reload. */
interface FileParse<T extends TaskShape> {
  tasks: ReplayTask<T>[];
  stats: ReplayStats;
}

export interface ReloadResult {
  added: number;
  total: number;
  files: string[];
}

export interface ReplayTaskSourceOptions {
  /** Base for relative record globs (default: process.cwd()). */
  cwd?: string;
  logger?: Logger;
  /** Replaces the seeded generator of the tool-call anchor draw. */
  random?: RandomFactory;
  /** What a failed reload keeps of its parses (default MAX_RETAINED_RELOAD_BYTES); smaller in tests. */
  maxRetainedBytes?: number;
}

/**
 * The source environment's own config, narrowed by its `configSchema`: invalid_request when the
 * config names another source or the schema refuses it. No file is read.
 */
export function sourceConfigFor(config: ReplayConfig, source: Pick<SourceEnvironment, "id" | "configSchema">): unknown {
  if (config.source.id !== source.id) throw invalidRequest(`config names source ${config.source.id} but environment ${source.id} was given`);
  if (!source.configSchema) return config.source;
  const narrowed = source.configSchema.safeParse(config.source);
  if (!narrowed.success) throw invalidRequest(`invalid source config: ${describeIssues(narrowed.error.issues)}`);
  return narrowed.data;
}

/**
 * Turns saved rollout records into fresh tasks. Loading is append-only and a pure function of the
 * files (numeric file order, per-record seeded draws), so independent workers agree on every index.
 * Follow mode: each reload re-expands the globs and appends tasks from files not seen before.
 */
export class ReplayTaskSource<T extends TaskShape = TaskShape, Rollout = unknown, Score = unknown>
  implements AsyncIterable<ReplayTask<T>>
{
  readonly config: ReplayConfig;
  readonly sourceConfig: unknown;
  readonly stats: ReplayStats = newReplayStats();

  private readonly list: ReplayTask<T>[] = [];
  /** Real paths of the files loaded (a file reached by two paths is one file). */
  private readonly done = new Set<string>();
  private readonly cwd: string;
  private readonly logger: Logger;
  private readonly random: RandomFactory | undefined;
  private inFlight: Promise<ReloadResult> | null = null;
  private cursor = 0;
  private readonly closing = new AbortController();
  private warnedEmpty = false;
  private readonly maxRetainedBytes: number;
  /** What the last reload parsed before it failed, reused for files unchanged since. */
  private retained: RetainedParses<FileParse<T>>;

  constructor(
    config: ReplayConfigInput | ReplayConfig,
    readonly source: SourceEnvironment<T, Rollout, Score>,
    options: ReplayTaskSourceOptions = {},
  ) {
    this.config = parseReplayConfig(config);
    this.sourceConfig = sourceConfigFor(this.config, source);
    this.cwd = options.cwd ?? process.cwd();
    this.logger = options.logger ?? defaultLogger();
    this.random = options.random;
    this.maxRetainedBytes = options.maxRetainedBytes ?? MAX_RETAINED_RELOAD_BYTES;
    this.retained = new RetainedParses(0);
  }

  get tasks(): readonly ReplayTask<T>[] {
    return this.list;
  }

  get size(): number {
    return this.list.length;
  }

  /** Capability seams report the source's behaviour, not the wrapper's. */
  get tools(): readonly unknown[] {
    return this.source.tools ?? [];
  }
  get user(): unknown {
    return this.source.user;
  }
  get definesTools(): boolean {
    return this.tools.length > 0;
  }
  get definesUser(): boolean {
    return this.source.user !== undefined;
  }
  definesGroupRewards(): boolean {
    return this.source.definesGroupRewards?.() ?? false;
  }
  get stops(): readonly string[] {
    return this.source.stops ?? [];
  }
  get stateType(): string | undefined {
    return this.source.stateType;
  }
  get needsContainer(): boolean {
    return this.source.needsContainer ?? false;
  }

  /** Loads what is there now; the same as reload(). */
  load(): Promise<ReloadResult> {
    return this.reload();
  }

  /** Appends tasks from files that appeared since the last load. One reload runs at a time. */
  reload(): Promise<ReloadResult> {
    this.inFlight ??= this.loadNewFiles().finally(() => {
      this.inFlight = null;
    });
    return this.inFlight;
  }

  /**
   * A reload that looked at the disk after this call began. A reload already in flight may have
   * expanded its globs before a file the caller knows of appeared: once it ends, if `satisfied` still
   * says no, one more runs (or the one started meanwhile, which began after this call, is joined).
   */
  private async reloadSinceNow(satisfied: () => boolean): Promise<void> {
    const joined = this.inFlight;
    if (joined === null) {
      await this.reload();
      return;
    }
    await joined.catch(() => undefined); // its failure is this reload's to report, if it repeats
    if (!satisfied()) await this.reload();
  }

  /** The task at `idx`, reloading once when it is past the end (a worker may lag behind). */
  async taskAt(idx: number): Promise<ReplayTask<T>> {
    if (idx >= this.list.length) await this.reloadSinceNow(() => idx < this.list.length);
    const task = this.list[idx];
    if (!Number.isInteger(idx) || idx < 0 || !task) {
      throw invalidRequest(`replay task ${idx} does not exist (${this.list.length} tasks)`);
    }
    return task;
  }

  /** The next unserved task, reloading when the list runs dry; undefined when nothing new exists. */
  async next(): Promise<ReplayTask<T> | undefined> {
    if (this.cursor >= this.list.length) await this.reloadSinceNow(() => this.cursor < this.list.length);
    const task = this.list[this.cursor];
    if (task) this.cursor += 1;
    return task;
  }

  /** Every task in order; when `poll_interval_ms` is set it waits for new records until close(). */
  async *[Symbol.asyncIterator](): AsyncIterator<ReplayTask<T>> {
    let i = 0;
    while (!this.closing.signal.aborted) {
      const task = this.list[i];
      if (task) {
        i += 1;
        yield task;
        continue;
      }
      if (this.config.poll_interval_ms === null) await this.reload();
      else {
        // Following: a reload that fails (a corrupt file, the storage refusing) is tried again at
        // the next poll, as reload() would be; ending the loop would stop the trainer's task feed.
        await this.reload().catch((error: unknown) => this.logger.warn({ err: error }, "replay reload failed; trying again at the next poll"));
      }
      if (i < this.list.length) continue;
      if (this.config.poll_interval_ms === null) return;
      try {
        await delay(this.config.poll_interval_ms, undefined, { signal: this.closing.signal });
      } catch {
        return; // closed
      }
    }
  }

  /** Stops any polling iterator. */
  close(): void {
    this.closing.abort();
  }

  /** How a trace becomes seeds; override to change only that. */
  seeds(trace: TraceRecord): Seed[] {
    const c = this.config;
    if (c.mode === "recheck") {
      const seed = recheckSeed(trace, c.recheck_prompt);
      return seed ? [seed] : [];
    }
    if (c.anchor === "compaction") return compactionSeeds(trace);
    return toolCallSeeds(trace, { maxAnchors: c.max_anchors, seed: c.seed, ...(this.random ? { random: this.random } : {}) });
  }

  /** Scoring is the source verifier's, on the source-typed task. */
  async score(task: ReplayTask<T>, rollout: Rollout): Promise<Score> {
    return this.source.score(task.task, rollout);
  }

  async scoreGroup(tasks: readonly ReplayTask<T>[], rollouts: readonly Rollout[]): Promise<Score[]> {
    if (this.source.scoreGroup) return this.source.scoreGroup(tasks.map((t) => t.task), rollouts);
    return Promise.all(tasks.map((task, i) => this.score(task, rollouts[i]!)));
  }

  /** The source's finalize, on the source-typed task (nothing when it has none). */
  async finalize(task: ReplayTask<T>, rollout: Rollout): Promise<void> {
    await this.source.finalize?.(task.task, rollout);
  }

  /** The source's validate, on the source-typed task (true when it has none). */
  async validate(task: ReplayTask<T>, rollout: Rollout): Promise<boolean> {
    return this.source.validate ? this.source.validate(task.task, rollout) : true;
  }

  /** Why `setup` would refuse `task` before running anything (a snapshot the source cannot restore). */
  setupRefusal(task: ReplayTask<T>): string | undefined {
    if (task.snapshot === null || this.source.restoreSnapshot) return undefined;
    return `task ${task.name} needs snapshot ${task.snapshot} but ${this.source.id} cannot restore snapshots`;
  }

  /** Runs the source's setup, then restores the anchor's sandbox snapshot when the task has one. */
  async setup(task: ReplayTask<T>): Promise<void> {
    const refusal = this.setupRefusal(task);
    if (refusal) throw invalidRequest(refusal);
    await this.source.setup?.(task.task);
    if (task.snapshot !== null) await this.source.restoreSnapshot!(task.task, task.snapshot);
  }

  private async loadNewFiles(): Promise<ReloadResult> {
    const markers = this.config.wait_for_step_marker ? await this.stepMarkers() : null;
    // Listed after the markers were read: a marker names only files already published, so this
    // listing holds every one it names (see completedPrefix).
    const matched = await expandGlobFiles(recordPatterns(this.config), this.cwd);
    // Known by real path: a link that appears later to a file already loaded is not a new file.
    const realOf = new Map(matched.map((f) => [f.path, f.real]));
    const fresh = matched
      .filter((f) => isRecordCandidate(f.path) && !this.done.has(f.real))
      .map((f) => f.path);
    if (matched.length === 0 && this.list.length === 0 && !this.warnedEmpty) {
      this.warnedEmpty = true;
      this.logger.warn({ records: this.config.records }, "replay records matched no files yet");
    }
    const files = markers ? this.completedPrefix(fresh, markers) : fresh;

    // Build everything first and commit at the end: a refusal leaves the task list untouched. What
    // it parsed until then is kept (bounded) for the next reload, which reads only files that
    // changed since or were not reached: a corrupt file late in a run would otherwise cost a re-read of every good
    // file before it at every poll.
    const added: ReplayTask<T>[] = [];
    const stats = newReplayStats();
    const retained = new RetainedParses<FileParse<T>>(this.maxRetainedBytes);
    try {
      for (const file of files) {
        const real = realOf.get(file)!;
        const base = this.list.length + added.length;
        // Taken before the read: a change while it runs gives the file another identity next time.
        const identity = await fileIdentity(file);
        const kept = this.retained.get(real, identity);
        const parse = kept ? kept.value : await this.loadFile(file, base);
        // Appended one by one: spreading 100k+ tasks into push() overflows the call stack.
        for (const task of kept && kept.base !== base ? rebased(parse.tasks, base) : parse.tasks) added.push(task);
        addReplayStats(stats, parse.stats);
        if (identity !== null) retained.keep(real, kept ?? { identity, base, value: parse, cost: parse.stats.read.bytesParsed });
      }
    } catch (error) {
      this.retained = retained;
      throw error;
    }
    this.retained = new RetainedParses(0);

    for (const task of added) this.list.push(task);
    for (const file of files) this.done.add(realOf.get(file)!);
    addReplayStats(this.stats, stats);
    if (files.length > 0) {
      this.logger.info(
        { tasks: this.list.length, added: added.length, files: files.length, skipped: { ...stats.read.skipped, foreign: stats.foreign, no_seed: stats.noSeed, overlong: stats.overlong } },
        "replay tasks loaded",
      );
    }
    return { added: added.length, total: this.list.length, files };
  }

  /**
   * What the step markers list, for each step directory holding a file not loaded yet, in sorted
   * order up to the first such file its marker does not list (nothing after it is consumed).
   */
  private async stepMarkers(): Promise<Map<string, Set<string>>> {
    const markers = new Map<string, Set<string>>();
    for (const file of await expandGlobFiles(recordPatterns(this.config), this.cwd)) {
      if (stepOfPath(file.path) === null || this.done.has(file.real) || !isRecordCandidate(file.path)) continue;
      const dir = path.dirname(file.path);
      if (!markers.has(dir)) markers.set(dir, await completedFiles(dir));
      if (!markers.get(dir)!.has(path.basename(file.path))) break;
    }
    return markers;
  }

  /**
   * Files in sorted order up to the first one whose step has not been marked complete. The markers
   * were read before `files` was listed: a listing older than its marker could miss a file the
   * marker names (an env published meanwhile) and take the step's later files before it. A step
   * directory that appeared in between has no marker read yet and waits for the next reload.
   */
  private completedPrefix(files: readonly string[], markers: ReadonlyMap<string, ReadonlySet<string>>): string[] {
    const out: string[] = [];
    for (const file of files) {
      if (stepOfPath(file) !== null && !markers.get(path.dirname(file))?.has(path.basename(file))) break; // later files wait too, so order is kept
      out.push(file);
    }
    return out;
  }

  /**
   * A file that vanished between the glob and its open (retention removed it) is skipped with a
   * warning, not a failed reload: it loads nothing, and is never looked for again.
   */
  private async loadFile(file: string, base: number): Promise<FileParse<T>> {
    try {
      return await this.loadFileOnce(file, base);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      this.logger.warn({ file }, "replay record file vanished before it was read; skipping it");
      return { tasks: [], stats: newReplayStats() };
    }
  }

  private async loadFileOnce(file: string, base: number): Promise<FileParse<T>> {
    const attempt = (useIndex: boolean) => {
      const stats = newReplayStats();
      return this.collect(file, base, stats, useIndex).then((tasks) => ({ tasks, stats }));
    };
    try {
      return await attempt(true);
    } catch (error) {
      if (!(error instanceof ReplayError && error.reason === "index_mismatch")) throw error;
      // The index passed its structural checks but disagrees with the bytes: trust only the file.
      this.logger.warn({ file, reason: error.message }, "rollout index disagrees with its file; parsing in full");
      const result = await attempt(false);
      result.stats.indexFallbacks += 1;
      return result;
    }
  }

  private async collect(file: string, base: number, stats: ReplayStats, useIndex: boolean): Promise<ReplayTask<T>[]> {
    const out: ReplayTask<T>[] = [];
    const records = readRecords(file, {
      filters: recordFilters(this.config),
      stats: stats.read,
      useIndex,
      verifySha256: this.config.verify_index_sha256,
      logger: this.logger,
    });
    for await (const record of records) {
      const typed = this.source.taskSchema.safeParse(record.trace.task);
      if (!typed.success) {
        stats.foreign += 1; // e.g. another env's record in a mixed file
        continue;
      }
      const seeds = this.seeds(record.trace);
      if (seeds.length === 0) stats.noSeed += 1;
      for (const seed of seeds) {
        if (this.config.max_seed_tokens !== null && seed.tokens > this.config.max_seed_tokens) {
          stats.overlong += 1;
          continue;
        }
        const idx = base + out.length;
        const task = { ...typed.data, idx, name: seed.name, prompt: seed.prompt } as T;
        out.push(
          Object.freeze({
            idx,
            name: seed.name,
            prompt: seed.prompt,
            task,
            snapshot: seed.snapshot,
            seedTokens: seed.tokens,
            lineage: Object.freeze({
              mode: this.config.mode,
              anchor: seed.anchor,
              sourceEnv: this.source.id,
              sourceTraceId: record.trace.id,
              sourceFile: record.file,
              sourceStep: stepOfPath(record.file),
              sourceOrdinal: record.ordinal,
              sourceTaskIdx: record.trace.task.idx,
              sourceTaskName: record.trace.task.name,
              anchorNode: seed.anchorNode,
            }),
          }),
        );
      }
    }
    return out;
  }
}
