import type { Command } from "commander";
import { deadlineFrom, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program.command("resume <checkpoint_id>").description("resume (or abort) stage by stage in reverse").option("--timeout-s <s>", "deadline, seconds from now"),
  ).action(async (id: string, flags: ClientFlags & { timeoutS?: string }) => {
    await withClient(flags, async (client) => printJson(await client.resume({ checkpoint_id: id, deadline_ts: deadlineFrom(flags.timeoutS) })));
  });
}
