import type { Command } from "commander";
import { deadlineFrom, parseEpisodes, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program
      .command("retire")
      .description("retire attempts, callers before callees (environment, agent, then model and resources)")
      .requiredOption("--episodes <keys|@file>", "attempts to retire")
      .option("--id <checkpoint_id>", "checkpoint id carried by the message")
      .option("--timeout-s <s>", "deadline, seconds from now"),
  ).action(async (flags: ClientFlags & { episodes: string; id?: string; timeoutS?: string }) => {
    await withClient(
      flags,
      () => parseEpisodes(flags.episodes),
      async (client, episodes) => printJson(await client.retire({ ...(flags.id !== undefined && { checkpoint_id: flags.id }), episode_ids: episodes, deadline_ts: deadlineFrom(flags.timeoutS) })),
    );
  });
}
