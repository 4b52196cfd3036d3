import { describe, expect, it } from "vitest";
import { assertJournalEntryFits, MAX_JOURNAL_ENTRY_BYTES } from "../../../coordinator/ha/decision-journal.js";
import { assertConcurrencyFits, maxRowsInFlight, worstEntryWithoutScope, worstScopeEntryBytes } from "../../../coordinator/collect/scope-ceiling.js";
import {
  CheckpointError,
  CommitRequestSchema,
  CtlCommitRequestSchema,
  MAX_ATTEMPT,
  MAX_CHECKPOINT_ID_CHARS,
  MAX_CONTROL_MESSAGE_BYTES,
  MAX_INCARNATION_CHARS,
  MAX_ROLLOUT_ID_CHARS,
  MAX_SCOPE,
  captureKey,
  decodeRequest,
  encodeMessage,
  type EpisodeId,
} from "../../../protocol/index.js";

/**
 * The --concurrency ceiling: a checkpoint's scope at the ceiling, every entry as long as the
 * schemas allow (the collection's longest rollout id, the last attempt there is), still encodes
 * within every limit it meets: the controller's commit request, the decision journal's entry (the
 * tightest, with its other fields at their longest) and the coordinator's commit to a participant.
 */

/** `n` distinct valid rollout ids of exactly `chars` characters. */
function rolloutIds(n: number, chars: number): string[] {
  return Array.from({ length: n }, (_, i) => {
    const tail = i.toString(36);
    return `${"r".repeat(chars - tail.length)}${tail}`;
  });
}

function worstScope(n: number, chars: number): EpisodeId[] {
  return rolloutIds(n, chars).map((rollout_id) => ({ rollout_id, attempt: MAX_ATTEMPT }));
}

describe("the --concurrency ceiling", () => {
  it.each([6, 10, 36, 64, MAX_ROLLOUT_ID_CHARS])("a worst-case scope at the ceiling fits every message it travels in (rollout ids of %i characters)", (chars) => {
    const ceiling = maxRowsInFlight(chars);
    expect(ceiling).toBeGreaterThan(0);
    expect(ceiling).toBeLessThanOrEqual(MAX_SCOPE);
    const scope = worstScope(ceiling, chars);
    expect(Buffer.byteLength(JSON.stringify(scope[0]))).toBe(worstScopeEntryBytes(chars) - 1);

    // The controller's commit request, as the client sends it and the coordinator decodes it.
    const request = { checkpoint_id: "c".repeat(MAX_CHECKPOINT_ID_CHARS), deadline_ts: 9_999_999_999.999, episode_ids: scope, stop: true };
    const wire = encodeMessage(request);
    expect(() => decodeRequest(CtlCommitRequestSchema, wire)).not.toThrow();

    // The journal entry, with every other field at its longest: all rows in the scope, or some in
    // the restarts instead (capture keys, shorter than their scope entries).
    expect(() => assertJournalEntryFits({ ...worstEntryWithoutScope(), scope })).not.toThrow();
    const half = Math.floor(ceiling / 2);
    expect(() => assertJournalEntryFits({ ...worstEntryWithoutScope(), scope: scope.slice(half), restarts: scope.slice(0, half).map(captureKey) })).not.toThrow();

    // The coordinator's commit to each participant.
    const commit = {
      checkpoint_id: "c".repeat(MAX_CHECKPOINT_ID_CHARS),
      deadline_ts: 9_999_999_999.999,
      epoch: Number.MAX_SAFE_INTEGER,
      incarnation: "n".repeat(MAX_INCARNATION_CHARS),
      checkpoint_dir: `/${"d".repeat(4095)}`,
      episode_ids: scope,
      stop: true,
    };
    expect(Buffer.byteLength(encodeMessage(commit))).toBeLessThanOrEqual(MAX_CONTROL_MESSAGE_BYTES - 16 * 1024);
    expect(() => decodeRequest(CommitRequestSchema, encodeMessage(commit))).not.toThrow();
  });

  it("is tight, not a guess: a few rows more of the same worst case no longer fit the journal entry", () => {
    const chars = MAX_ROLLOUT_ID_CHARS;
    const over = worstScope(maxRowsInFlight(chars) + 2, chars);
    expect(() => assertJournalEntryFits({ ...worstEntryWithoutScope(), scope: over })).toThrow(/payload_too_large|limit is/);
    expect(MAX_JOURNAL_ENTRY_BYTES).toBeLessThan(MAX_CONTROL_MESSAGE_BYTES);
  });

  it("grows as the rollout ids get shorter; the schema's longest ids give the floor", () => {
    expect(maxRowsInFlight(10)).toBeGreaterThan(maxRowsInFlight(64));
    expect(maxRowsInFlight()).toBe(maxRowsInFlight(MAX_ROLLOUT_ID_CHARS));
    expect(maxRowsInFlight()).toBeGreaterThan(1000);
  });

  it("refuses a larger concurrency (invalid_request naming the flag and the ceiling), unless the rows themselves are no more", () => {
    const ceiling = maxRowsInFlight(10);
    const rows = rolloutIds(ceiling + 1, 10).map((rolloutId) => ({ rolloutId }));
    expect(() => assertConcurrencyFits(ceiling, rows)).not.toThrow();
    let refusal: unknown;
    try {
      assertConcurrencyFits(ceiling + 1, rows);
    } catch (error) {
      refusal = error;
    }
    expect(refusal).toBeInstanceOf(CheckpointError);
    expect((refusal as CheckpointError).code).toBe("invalid_request");
    expect((refusal as CheckpointError).message).toContain(`--concurrency ${ceiling + 1} is over ${ceiling},`);
    // No more rows than the ceiling: they bound what is in flight, whatever the concurrency.
    expect(() => assertConcurrencyFits(1_000_000_000, rows.slice(0, ceiling))).not.toThrow();
  });
});
