/**
 * The flags of a participant program (`gym-ckpt attach`, `gym-ckpt gym`) whose values are
 * credentials, each with the variable the program reads when the flag is absent: a NATS URL may
 * carry a password or a `?token=`. Any local user reads a process's command line
 * (/proc/<pid>/cmdline), so the CLI hands these to its child in the environment instead.
 */
const SECRET_FLAGS: Readonly<Record<string, string>> = {
  "--nats": "GYM_CKPT_NATS_URL",
  "--token": "GYM_CKPT_TOKEN",
};

/**
 * `args` without the secret flags, and the variables that carry their values. The program sees the
 * same settings: a flag beats an inherited variable (the variable is overwritten here), and the
 * last of a flag given twice wins, as node's parseArgs takes it. A flag the program would refuse
 * stays on the command line for it to refuse: one with no value, an empty one (as a variable it
 * would read as unset, so the default server), or `--nats -x` (ambiguous to parseArgs; `--nats=-x`
 * is a value). Nothing after `--` is a flag.
 */
export function secretFlagsToEnv(args: readonly string[]): { args: string[]; env: Record<string, string> } {
  const kept: string[] = [];
  const env: Record<string, string> = {};
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === "--") {
      kept.push(...args.slice(i));
      break;
    }
    const equals = arg.indexOf("=");
    const variable = SECRET_FLAGS[equals === -1 ? arg : arg.slice(0, equals)];
    const value = equals === -1 ? args[i + 1] : arg.slice(equals + 1);
    if (variable === undefined || value === undefined || value === "" || (equals === -1 && value.startsWith("-"))) {
      kept.push(arg);
      continue;
    }
    env[variable] = value;
    if (equals === -1) i++;
  }
  return { args: kept, env };
}
