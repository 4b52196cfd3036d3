import type { Command } from "commander";
import { deadlineFrom, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program.command("renew <checkpoint_id>").description("extend every participant's lease (while the controller saves a large state before publishing)").option("--timeout-s <s>", "new deadline, seconds from now"),
  ).action(async (id: string, flags: ClientFlags & { timeoutS?: string }) => {
    await withClient(flags, async (client) => printJson(await client.renew({ checkpoint_id: id, deadline_ts: deadlineFrom(flags.timeoutS) })));
  });
}
