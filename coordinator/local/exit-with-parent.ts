/**
 * Preloaded (`node --import`) into a program started with `exitWithParent` (child-program.ts):
 * its stdin is a pipe from the parent, which never writes to it. The kernel closes the parent's
 * end however the parent ends — SIGKILL and a closed terminal included, which no clean-up of the
 * parent's own sees — and the EOF stops this program as a SIGTERM would, so its own clean-up runs
 * (the Gym launcher stops its servers). A clean-up still running after GRACE_MS (one waiting for
 * a NATS server that died with the parent) is cut short with SIGKILL: the programs survive a crash.
 */
const GRACE_MS = 10_000;

let stopping = false;
const stop = () => {
  if (stopping) return;
  stopping = true;
  process.kill(process.pid, "SIGTERM");
  setTimeout(() => process.kill(process.pid, "SIGKILL"), GRACE_MS).unref();
};
process.stdin.once("end", stop);
process.stdin.once("error", stop);
process.stdin.resume();
// Watching is no reason to stay alive: a program that is done exits as it would unwatched.
process.stdin.unref();
