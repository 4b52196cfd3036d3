import type { Command } from "commander";
import { deadlineFrom, parseEpisodes, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program
      .command("restore [checkpoint_id]")
      .description("restore a published checkpoint (LATEST by default) everywhere, all or nothing")
      .requiredOption("--episodes <keys|@file>", "the checkpointed (source) attempts to continue")
      .option("--timeout-s <s>", "deadline, seconds from now"),
  ).action(async (id: string | undefined, flags: ClientFlags & { episodes: string; timeoutS?: string }) => {
    await withClient(
      flags,
      () => parseEpisodes(flags.episodes),
      async (client, episodes) => printJson(await client.restore({ ...(id !== undefined && { checkpoint_id: id }), episode_ids: episodes, deadline_ts: deadlineFrom(flags.timeoutS) })),
    );
  });
}
