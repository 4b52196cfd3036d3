import type { Command } from "commander";
import { deadlineFrom, parseEpisodes, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program
      .command("commit <checkpoint_id>")
      .description("journal the decision, then commit on every participant at once")
      .option("--timeout-s <s>", "deadline, seconds from now")
      .option("--episodes <keys|@file>", "commit scope: capture keys or @file.json (default: everything, which a model participant refuses)")
      .option("--stop", "the controller stops after this checkpoint"),
  ).action(async (id: string, flags: ClientFlags & { timeoutS?: string; episodes?: string; stop?: boolean }) => {
    await withClient(
      flags,
      () => (flags.episodes !== undefined ? parseEpisodes(flags.episodes) : null),
      async (client, episodes) =>
        printJson(await client.commit({ checkpoint_id: id, deadline_ts: deadlineFrom(flags.timeoutS), episode_ids: episodes, stop: flags.stop ?? false })),
    );
  });
}
