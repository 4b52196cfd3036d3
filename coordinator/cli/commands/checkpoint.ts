import type { Command } from "commander";
import { controllerStateFrom, deadlineFrom, parseEpisodes, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program
      .command("checkpoint")
      .description("prepare → commit → publish → resume, in one call")
      .option("--id <checkpoint_id>", "checkpoint id (generated when omitted)")
      .option("--timeout-s <s>", "deadline, seconds from now")
      .option("--episodes <keys|@file>", "commit scope: capture keys or @file.json (default: everything, which a model participant refuses)")
      .option("--stop", "the controller stops after this checkpoint")
      .option("--state-json <json>", "controller state, inline JSON")
      .option("--state-file <name>", "controller state file already in the checkpoint directory"),
  ).action(async (flags: ClientFlags & { id?: string; timeoutS?: string; episodes?: string; stop?: boolean; stateJson?: string; stateFile?: string }) => {
    await withClient(flags, async (client) => {
      const reply = await client.checkpoint({
        ...(flags.id !== undefined && { checkpoint_id: flags.id }),
        deadline_ts: deadlineFrom(flags.timeoutS),
        episode_ids: flags.episodes !== undefined ? parseEpisodes(flags.episodes) : null,
        stop: flags.stop ?? false,
        controller_state: controllerStateFrom(flags),
      });
      if (flags.json) printJson(reply);
      else process.stdout.write(`published ${reply.checkpoint_id} (epoch ${reply.epoch}, ${reply.participants} participants) at ${reply.manifest_path}\n`);
    });
  });
}
