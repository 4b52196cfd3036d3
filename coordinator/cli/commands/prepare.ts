import type { Command } from "commander";
import { deadlineFrom, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

export function register(program: Command): void {
  withClientOptions(
    program.command("prepare <checkpoint_id>").description("prepare stage by stage; prints blockers if a stage is not ready").option("--timeout-s <s>", "deadline, seconds from now"),
  ).action(async (id: string, flags: ClientFlags & { timeoutS?: string }) => {
    await withClient(flags, async (client) => {
      const reply = await client.prepare({ checkpoint_id: id, deadline_ts: deadlineFrom(flags.timeoutS) });
      printJson(reply);
      if (!reply.prepared) process.exitCode = 1;
    });
  });
}
