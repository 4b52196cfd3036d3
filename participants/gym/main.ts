import { parseArgs } from "node:util";
import { ExitedBeforeReady, GYM_PROCESSES, launchGym, type Gym, type GymProcessName } from "./gym-launcher.js";
import { DEFAULT_NATS_CONNECT_WAIT_MS, DEFAULT_NATS_URL, describeZodError, dieByHangup, envSetting, isHttpUrl } from "../../protocol/index.js";
import { LaunchFlagsSchema, argvRefusal, millisecondFlagRefusal, urlHasCredentials } from "./server-runtime.js";

/**
 * `gym-ckpt gym`: starts the whole reference Gym on loopback for demos and manual tries, prints
 * one JSON line with every URL, and stops every process on SIGINT/SIGTERM/SIGHUP.
 *
 *   --nats URL (GYM_CKPT_NATS_URL, default nats://127.0.0.1:4222)   --deployment NAME (default "default")
 *   --token TOKEN (GYM_CKPT_TOKEN)   --checkpoint-root DIR   --lease-grace-seconds N
 *   --token-delay-ms N (policy streaming pace)   --resources-mode stateless|restart_only   --verify replay|wait
 *   --policy-url URL (use a running OpenAI-compatible policy backend instead of starting the fake one)
 */
const USAGE =
  "usage: gym-ckpt gym [--nats URL] [--deployment NAME] [--token TOKEN] [--checkpoint-root DIR]\n" +
  "                    [--lease-grace-seconds N] [--token-delay-ms N] [--resources-mode MODE] [--verify replay|wait]\n" +
  "                    [--policy-url URL] [--verbose]\n";

/** A configuration error: one line (naming a flag, never a value), exit 2, before any server starts. */
function refuse(why: string): never {
  process.stderr.write(`gym: invalid configuration: ${why}\n`);
  process.exit(2);
}

let values: ReturnType<typeof parseGymArgs>["values"];
try {
  values = parseGymArgs().values;
} catch (error) {
  refuse(argvRefusal(error));
}
function parseGymArgs() {
  return parseArgs({
    args: process.argv.slice(2),
    strict: true,
    options: {
      nats: { type: "string" },
      deployment: { type: "string" },
      token: { type: "string" },
      "checkpoint-root": { type: "string" },
      "lease-grace-seconds": { type: "string" },
      "token-delay-ms": { type: "string" },
      "resources-mode": { type: "string" },
      verify: { type: "string" },
      "policy-url": { type: "string" },
      verbose: { type: "boolean" },
      help: { type: "boolean" },
    },
  });
}
if (values.help) {
  process.stdout.write(USAGE);
  process.exit(0);
}
// Checked here, once: each server would refuse a bad value by itself, and the first to exit would
// stop the rest with a message about that server rather than the flag.
const flags = LaunchFlagsSchema.safeParse({
  nats: values.nats ?? envSetting("GYM_CKPT_NATS_URL") ?? DEFAULT_NATS_URL,
  // Env only here: every server reads it, and each would refuse a bad one by itself.
  natsConnectWaitMs: envSetting("GYM_CKPT_NATS_CONNECT_WAIT_MS") ?? String(DEFAULT_NATS_CONNECT_WAIT_MS),
  deployment: values.deployment ?? envSetting("GYM_CKPT_DEPLOYMENT") ?? "default",
  token: values.token ?? envSetting("GYM_CKPT_TOKEN") ?? "",
  checkpointRoot: values["checkpoint-root"] ?? envSetting("GYM_CKPT_CHECKPOINT_ROOT"),
  leaseGraceSeconds: values["lease-grace-seconds"],
});
if (!flags.success) refuse(describeZodError(flags.error));
const { nats, deployment, token, checkpointRoot, leaseGraceSeconds } = flags.data;
// The Gym's own flags too: a server refusing one would fail the launch with exit 1 and its output,
// after the servers before it started, for what is a configuration error (exit 2, not restarted).
const RESOURCES_MODES = ["stateless", "restart_only"];
const VERIFY_MODES = ["replay", "wait"];
if (values["resources-mode"] !== undefined && !RESOURCES_MODES.includes(values["resources-mode"])) refuse(`--resources-mode must be one of ${RESOURCES_MODES.join(", ")}`);
if (values.verify !== undefined && !VERIFY_MODES.includes(values.verify)) refuse(`--verify must be one of ${VERIFY_MODES.join(", ")}`);
const tokenDelay = values["token-delay-ms"];
// As the policy backend checks it (a value it would refuse must not start the other servers first).
if (tokenDelay !== undefined && (millisecondFlagRefusal({ "token-delay-ms": tokenDelay }) || Number(tokenDelay) > 60_000)) refuse("--token-delay-ms must be a decimal number from 0 to 60000");
const policyUrl = values["policy-url"];
if (policyUrl !== undefined && !isHttpUrl(policyUrl)) refuse("--policy-url must be an http or https URL");
// What the model proxy refuses as its --upstream (the value is not echoed: its userinfo or query may be a secret).
if (policyUrl !== undefined && urlHasCredentials(policyUrl)) refuse("--policy-url may not carry credentials (user:password@): the model proxy forwards each caller's Authorization header instead");
if (policyUrl !== undefined && (new URL(policyUrl).search || new URL(policyUrl).hash)) refuse("--policy-url may not carry a query or fragment");
// Installed before the launch: a signal during start-up must stop the children started so far.
const abort = new AbortController();
let gym: Gym | undefined;
let stopping = false;
let hungUp = false;
/** Exits once stopped; after a hangup by SIGHUP itself (see dieByHangup). */
const leave = (code: number): void => (hungUp ? dieByHangup() : process.exit(code));
const stop = async (code: number, signal?: NodeJS.Signals) => {
  if (stopping) return;
  stopping = true;
  hungUp = signal === "SIGHUP";
  abort.abort();
  // During start-up the launcher ends its own children once aborted, then exits below.
  if (!gym) return;
  await gym.stop();
  leave(code);
};
// `on`, not `once`: Ctrl-C reaches this process twice (from the terminal and forwarded by the `gym-ckpt`
// wrapper); a second copy must not kill it mid-stop (stop() ignores it).
process.on("SIGINT", () => void stop(0));
process.on("SIGTERM", () => void stop(0));
// Its terminal closed: stopped as on SIGTERM, not killed with its servers' membership entries left.
process.on("SIGHUP", () => void stop(0, "SIGHUP"));
gym = await launchGym({
  nats,
  deployment,
  token,
  ...(checkpointRoot !== undefined && { checkpointRoot }),
  ...(leaseGraceSeconds !== undefined && { leaseGraceSeconds }),
  args: {
    ...(values["token-delay-ms"] && { policy: ["--token-delay-ms", values["token-delay-ms"]] }),
    resources: [...(values["resources-mode"] ? ["--mode", values["resources-mode"]] : []), ...(values.verify ? ["--verify", values.verify] : [])],
  },
  // A policy backend running elsewhere (an inference server, or the demo's long-lived fake).
  ...(values["policy-url"] && { external: { policy: values["policy-url"] } }),
  ...(values.verbose && { onOutput: (name: GymProcessName, line: string) => process.stderr.write(`[${name}] ${line}\n`) }),
  signal: abort.signal,
}).catch((error: unknown) => {
  if (stopping) leave(0);
  process.stderr.write(`gym: ${error instanceof Error ? error.message : String(error)}\n`);
  // A server that refused its configuration (exit 2: a metrics port it cannot listen on, NATS
  // credentials refused) is configuration here too: exit 1 would have a supervisor restart for ever.
  process.exit(error instanceof ExitedBeforeReady && error.exitCode === 2 ? 2 : 1);
});
// A signal that came as the last child got ready found no gym to stop.
if (stopping) {
  await gym.stop();
  leave(0);
}
const urls = Object.fromEntries(GYM_PROCESSES.map((name) => [name, gym!.urls[name]]));
process.stdout.write(`${JSON.stringify({ ready: true, name: "gym", urls, instances: gym.instances })}\n`);
// A child that dies on its own takes the demo down with it, visibly, and the exit code says so.
const childDied = (name: GymProcessName, code: number | null, signal: NodeJS.Signals | null) => {
  if (stopping) return;
  process.stderr.write(`gym: ${name} exited (code ${code}, signal ${signal}); stopping the rest\n`);
  void stop(1);
};
for (const p of gym.processes.values()) void p.exited.then(({ code, signal }) => childDied(p.name, code, signal));
// One that died before the launch finished is already gone from the map.
for (const name of GYM_PROCESSES) if (!(name === "policy" && values["policy-url"]) && !gym.processes.has(name)) childDied(name, null, null);
