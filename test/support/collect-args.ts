import { join } from "node:path";

/**
 * The command line of a `gym-ckpt collect` run over NATS whose tasks, results and checkpoints are
 * all in `root` (`tasks.jsonl`, `results.jsonl`, the checkpoint root itself); `extra` follows.
 */
export function collectArgs(o: { natsUrl: string; deployment: string; token: string; root: string; runUrl: string }, extra: string[] = []): string[] {
  return [
    "collect",
    "--nats-url", o.natsUrl,
    "--deployment", o.deployment,
    "--token", o.token,
    "--tasks", join(o.root, "tasks.jsonl"),
    "--out", join(o.root, "results.jsonl"),
    "--checkpoint-dir", o.root,
    "--run-url", o.runUrl,
    ...extra,
  ];
}
