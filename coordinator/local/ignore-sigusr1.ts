/**
 * Preloaded (`node --import`, through NODE_OPTIONS so every node process below inherits it) into
 * the participant programs the CLI starts (attach proxy, Gym launcher and its servers, seeds): they
 * hold the participants' token, and Node's default SIGUSR1 action opens the V8 inspector on
 * 127.0.0.1:9229. A SIGUSR1 meant for a collector often reaches the whole process group or job.
 * No imports: it runs before the program's own modules load.
 */
process.on("SIGUSR1", () => undefined);
