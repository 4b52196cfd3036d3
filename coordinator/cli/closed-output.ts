/**
 * A reader that goes away early (`gym-ckpt ls | head -1`) fails the next write with EPIPE, and a
 * terminal that goes away (its window closed, an ssh session dropped) with EIO; Node raises either
 * as an unhandled 'error' event: a stack trace and exit 1, read as a refusal although the op ran,
 * and for `collect` a crash in the middle of its hangup stop. The rest of the output is dropped
 * instead, and the exit code stays the command's.
 */
export function dropOutputOfGoneReaders(): void {
  for (const stream of [process.stdout, process.stderr]) {
    stream.on("error", (error: NodeJS.ErrnoException) => {
      // Once the error destroyed the stream, later writes are dropped without another event.
      if (error.code !== "EPIPE" && error.code !== "EIO") throw error;
    });
  }
}
