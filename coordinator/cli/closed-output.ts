import { toCheckpointError } from "../../protocol/index.js";

/**
 * A reader that goes away early (`gym-ckpt ls | head -1`) fails the next write with EPIPE, and a
 * terminal that goes away (its window closed, an ssh session dropped) with EIO; Node raises either
 * as an unhandled 'error' event: a stack trace and exit 1, read as a refusal although the op ran,
 * and for `collect` a crash in the middle of its hangup stop. The rest of the output is dropped
 * instead, and the exit code stays the command's.
 *
 * Any other failure is the output's storage refusing it (`gym-ckpt ls > listing.txt` on a full
 * disk, ENOSPC): the output is incomplete, so it is a refusal like any other, one catalog line on
 * stderr (`storage_error`, exit 1) rather than an uncaught exception's stack trace. What the
 * command goes on to write to that stream is dropped.
 */
export function dropOutputOfGoneReaders(): void {
  for (const [stream, name] of [[process.stdout, "standard output"], [process.stderr, "standard error"]] as const) {
    stream.on("error", (error: NodeJS.ErrnoException) => {
      // Once the error destroyed the stream, later writes are dropped without another event.
      if (error.code === "EPIPE" || error.code === "EIO") return;
      const refusal = toCheckpointError(error);
      process.exitCode = refusal.code === "invalid_request" ? 2 : 1;
      if (stream !== process.stderr) process.stderr.write(`error ${refusal.code}: ${refusal.message} (writing ${name})\n`);
    });
  }
}
