import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { register } from "../../../coordinator/cli/commands/collect.js";

/** docs/collect.md: "`--json` is refused (collect prints a summary, the rows are in `--out`)". */
describe("gym-ckpt collect --help", () => {
  it("does not advertise --json, which collect refuses with invalid_request", () => {
    const program = new Command();
    register(program);
    const help = program.commands.find((c) => c.name() === "collect")!.helpInformation();
    expect(help).not.toMatch(/--json/);
  });
});
