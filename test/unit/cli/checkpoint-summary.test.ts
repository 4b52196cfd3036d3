import { describe, expect, it } from "vitest";
import type { CtlReplyOf } from "../../../protocol/index.js";
import { checkpointSummary } from "../../../coordinator/cli/commands/checkpoint.js";

/**
 * docs/api.md: once published the `checkpoint` op succeeds, and a participant that then failed to
 * resume is listed in `resume_failures` (it stays parked until its lease expires). The human
 * summary of `gym-ckpt checkpoint` printed only "published …", so an operator without --json never
 * learnt that a Gym server was left parked; each failure is now a `warning <code>:` line on stderr,
 * as `ls` warns.
 */
const reply = (resume_failures: CtlReplyOf<"checkpoint">["resume_failures"]): CtlReplyOf<"checkpoint"> => ({
  checkpoint_id: "c1",
  epoch: 3,
  checkpoint_dir: "/ckpt/c1",
  manifest_path: "/ckpt/c1/checkpoint.json",
  published_at: 1,
  participants: 4,
  restarts: [],
  deleted: [],
  resume_failures,
  timings_ms: { prepare: 1, commit: 1, publish: 1, resume: 1 },
});

describe("gym-ckpt checkpoint's summary", () => {
  it("is one line when everyone resumed", () => {
    expect(checkpointSummary(reply([]))).toEqual({ stdout: "published c1 (epoch 3, 4 participants) at /ckpt/c1/checkpoint.json\n", stderr: "" });
  });

  it("names every participant that failed to resume on stderr", () => {
    const summary = checkpointSummary(
      reply([
        { kind: "agent", instance: "a1", code: "outcome_unknown", detail: "no reply" },
        { kind: "resources", instance: "r1", code: "unreachable", detail: "no responders" },
      ]),
    );
    expect(summary.stdout).toBe("published c1 (epoch 3, 4 participants) at /ckpt/c1/checkpoint.json\n");
    expect(summary.stderr.split("\n").filter(Boolean)).toEqual([
      expect.stringMatching(/^warning outcome_unknown: agent\/a1 did not resume: no reply/),
      expect.stringMatching(/^warning unreachable: resources\/r1 did not resume: no responders/),
    ]);
  });
});
