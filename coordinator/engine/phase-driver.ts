import type { Context } from "@opentelemetry/api";
import type { Kind } from "../../protocol/index.js";
import { inFanOutSpan, SPAN_ATTR, type FanOutOutcome } from "../telemetry/coordinator-telemetry.js";
import type { ParticipantRef } from "./participant-client.js";

export interface StageResult<T> {
  stage: readonly Kind[];
  outcomes: T[];
}

/** What a staged run did: each stage's outcomes, and the stage it stopped at (null: it ran them all). */
export interface StagedRun<T> {
  results: StageResult<T>[];
  stoppedAt: readonly Kind[] | null;
}

export interface StagedRunOptions<T> {
  /** Span name prefix for the per-stage child spans. */
  spanName: string;
  parent?: Context;
  /** Returns true when the stage may be followed by the next one; default: always continue. */
  proceed?: (outcomes: T[]) => boolean;
  /** Awaited before any stage after the first runs (work that may overlap only the first stage). */
  gate?: Promise<unknown>;
  /**
   * Checked before each stage: once true, that stage and every later one are sent at once (a run
   * that goes on past failures, its deadline passed). Stalled stages in turn would each add the
   * request slack to the answer, which then leaves after the caller stopped waiting.
   */
  allAtOnce?: () => boolean;
}

/** Members of the given kinds, in a stable order (instance name). */
export function membersOf<P extends ParticipantRef>(members: readonly P[], kinds: readonly Kind[]): P[] {
  return members.filter((m) => kinds.includes(m.kind)).sort((a, b) => (a.instance < b.instance ? -1 : a.instance > b.instance ? 1 : 0));
}

/**
 * Staged fan-out: stages run one after another, the members of a stage in parallel (one directed
 * request each). Empty stages are skipped. `proceed` decides after each stage whether to go on:
 * prepare stops at the first stage not fully prepared; resume and clean-up retire go on past failures.
 */
export async function runStages<P extends ParticipantRef, T extends FanOutOutcome>(
  stages: readonly (readonly Kind[])[],
  members: readonly P[],
  /** `stagesLeft`: the stages still to run in turn, this one included (1 for stages sent at once). */
  call: (member: P, ctx: Context | undefined, stagesLeft: number) => Promise<T>,
  options: StagedRunOptions<T>,
): Promise<StagedRun<T>> {
  const results: StageResult<T>[] = [];
  const runStage = async (stage: readonly Kind[], stageMembers: P[], stagesLeft: number): Promise<StageResult<T>> => ({
    stage,
    outcomes: await inFanOutSpan(
      `${options.spanName}.${stage.join("+")}`,
      { [SPAN_ATTR.stage]: stage.join("+"), [SPAN_ATTR.participants]: stageMembers.length },
      options.parent,
      (ctx) => Promise.all(stageMembers.map((member) => call(member, ctx, stagesLeft))),
    ),
  });
  const withMembers = stages.map((stage) => ({ stage, stageMembers: membersOf(members, stage) })).filter((s) => s.stageMembers.length > 0);
  for (const [i, { stage, stageMembers }] of withMembers.entries()) {
    if (results.length > 0 && options.gate) await options.gate;
    if (options.allAtOnce?.()) {
      results.push(...(await Promise.all(withMembers.slice(i).map((s) => runStage(s.stage, s.stageMembers, 1)))));
      break;
    }
    const result = await runStage(stage, stageMembers, withMembers.length - i);
    results.push(result);
    if (options.proceed && !options.proceed(result.outcomes)) return { results, stoppedAt: stage };
  }
  return { results, stoppedAt: null };
}

/** All members at once (commit, restore, renew, status). */
export async function runAll<P extends ParticipantRef, T>(members: readonly P[], call: (member: P) => Promise<T>): Promise<T[]> {
  return Promise.all(members.map((member) => call(member)));
}
