import type { Command } from "commander";
import type { CtlReplyOf } from "../../../protocol/index.js";
import { controllerStateFrom, deadlineFrom, parseEpisodes, printJson, withClient, withClientOptions, type ClientFlags } from "../shared.js";

/**
 * The human summary: the published checkpoint on stdout and, on stderr, every participant that did
 * not resume (the op succeeded, but that one stays parked until its lease expires), as `ls` warns.
 */
export function checkpointSummary(reply: CtlReplyOf<"checkpoint">): { stdout: string; stderr: string } {
  return {
    stdout: `published ${reply.checkpoint_id} (epoch ${reply.epoch}, ${reply.participants} participants) at ${reply.manifest_path}\n`,
    stderr: reply.resume_failures
      .map((f) => `warning ${f.code}: ${f.kind}/${f.instance} did not resume: ${f.detail} (it resumes when its lease expires)\n`)
      .join(""),
  };
}

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
    const inputs = () => ({ episodes: flags.episodes !== undefined ? parseEpisodes(flags.episodes) : null, state: controllerStateFrom(flags) });
    await withClient(flags, inputs, async (client, { episodes, state }) => {
      const reply = await client.checkpoint({
        ...(flags.id !== undefined && { checkpoint_id: flags.id }),
        deadline_ts: deadlineFrom(flags.timeoutS),
        episode_ids: episodes,
        stop: flags.stop ?? false,
        controller_state: state,
      });
      if (flags.json) printJson(reply);
      else {
        const summary = checkpointSummary(reply);
        process.stdout.write(summary.stdout);
        process.stderr.write(summary.stderr);
      }
    });
  });
}
