import type { Command } from "commander";
import { deadlineFrom, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program
      .command("forget")
      .description("forget rollouts finished for good (same order as retire)")
      .requiredOption("--rollouts <ids>", "comma-separated rollout ids")
      .option("--id <checkpoint_id>", "checkpoint id carried by the message")
      .option("--timeout-s <s>", "deadline, seconds from now"),
  ).action(async (flags: ClientFlags & { rollouts: string; id?: string; timeoutS?: string }) => {
    await withClient(flags, async (client) =>
      printJson(
        await client.forget({
          ...(flags.id !== undefined && { checkpoint_id: flags.id }),
          rollout_ids: flags.rollouts.split(",").map((s) => s.trim()).filter(Boolean),
          deadline_ts: deadlineFrom(flags.timeoutS),
        }),
      ),
    );
  });
}
