import { Command } from "commander";
import { describe, expect, it } from "vitest";
import { register } from "../../../coordinator/cli/commands/coordinator.js";

/** A token on a command line is readable by every local user (ps, /proc/<pid>/cmdline): the help names each token's variable, as the client commands' help does. */
describe("gym-ckpt coordinator --help", () => {
  it("names the variables of --token and --controller-token", () => {
    const program = new Command();
    register(program);
    const help = program.commands.find((c) => c.name() === "coordinator")!.helpInformation().replace(/\s+/g, " ");
    expect(help).toMatch(/--token <token> [^-]*\(env GYM_CKPT_TOKEN[;)]/);
    expect(help).toMatch(/--controller-token <token> [^-]*\(env GYM_CKPT_CONTROLLER_TOKEN[;)]/);
  });
});
