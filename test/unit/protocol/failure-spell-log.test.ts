import { describe, expect, it } from "vitest";
import { CheckpointError, FailureSpellLog } from "../../../protocol/index.js";

function recorder() {
  const lines: { level: string; msg: string; fields: Record<string, unknown> }[] = [];
  const at = (level: string) => (fields: object, msg: string) => void lines.push({ level, msg, fields: fields as Record<string, unknown> });
  return { lines, logger: { warn: at("warn"), info: at("info"), debug: at("debug") } };
}

describe("FailureSpellLog", () => {
  it("repeats of the same failure are debug, but a different failure during the spell warns again: it is news (a participant unreachable, then refusing its credentials)", () => {
    const { lines, logger } = recorder();
    const spell = new FailureSpellLog(logger, "answers again");
    spell.failed(undefined, "participant_refused", { code: "unreachable" });
    spell.failed(undefined, "participant_refused", { code: "unreachable" });
    spell.failed(undefined, "participant_refused", { code: "unauthorized" });
    spell.failed(undefined, "participant_refused", { code: "unreachable" }); // alternating: warned of already
    spell.failed(undefined, "participant_refused", { code: "unauthorized" });
    spell.failed(new CheckpointError("storage_error", "disk full"), "retire failed; retrying");
    spell.failed(new CheckpointError("storage_error", "disk full"), "retire failed; retrying");
    spell.succeeded();
    expect(lines.map((l) => `${l.level} ${l.msg} ${String(l.fields["code"] ?? (l.fields["err"] as CheckpointError | undefined)?.code)}`)).toEqual([
      "warn participant_refused unreachable",
      "debug participant_refused unreachable",
      "warn participant_refused unauthorized",
      "debug participant_refused unreachable",
      "debug participant_refused unauthorized",
      "warn retire failed; retrying storage_error",
      "debug retire failed; retrying storage_error",
      "info answers again undefined",
    ]);
    expect(lines.at(-1)!.fields).toMatchObject({ failed_tries: 7 });
  });
});
