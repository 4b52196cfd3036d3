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

  it("names the variable --metrics-port overrides, as the coordinator's help does", () => {
    // collect reads OTEL_EXPORTER_PROMETHEUS_PORT when the flag is absent (docs/telemetry.md).
    const program = new Command();
    register(program);
    const help = program.commands.find((c) => c.name() === "collect")!.helpInformation();
    expect(help.replace(/\s+/g, " ")).toMatch(/--metrics-port <port> [^-]*\(env OTEL_EXPORTER_PROMETHEUS_PORT\)/);
  });
});
