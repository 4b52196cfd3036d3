import type { Command } from "commander";
import { controllerStateFrom, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program
      .command("publish <checkpoint_id>")
      .description("write checkpoint.json, then LATEST; apply retention")
      .option("--state-json <json>", "controller state, inline JSON")
      .option("--state-file <name>", "controller state file already in the checkpoint directory"),
  ).action(async (id: string, flags: ClientFlags & { stateJson?: string; stateFile?: string }) => {
    await withClient(
      flags,
      () => controllerStateFrom(flags),
      async (client, state) => printJson(await client.publish({ checkpoint_id: id, controller_state: state })),
    );
  });
}
