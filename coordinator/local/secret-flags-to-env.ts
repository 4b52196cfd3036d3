import { BearerTokenSchema } from "../../protocol/index.js";

/**
 * A flag of a participant program whose value is a credential, and the variable the program reads
 * when the flag is absent. Any local user reads a process's command line (/proc/<pid>/cmdline),
 * so the CLI hands these to its child in the environment instead. `moves`, where set, says which
 * values go: one it refuses stays for the program to refuse by the flag's name.
 */
export interface SecretFlag {
  variable: string;
  moves?: (value: string) => boolean;
}
export type SecretFlags = Readonly<Record<string, SecretFlag>>;

/** `gym-ckpt gym`'s: the NATS servers (a URL may carry a password or a `?token=`) and the control token. */
export const GYM_SECRET_FLAGS: SecretFlags = {
  "--nats": { variable: "GYM_CKPT_NATS_URL" },
  "--token": { variable: "GYM_CKPT_TOKEN" },
};

/**
 * `gym-ckpt attach model`'s: those and the cut endpoint's token. A cut token the proxy would refuse
 * stays a flag: its refusal then names `--cut-token`, not a variable the user never set.
 */
export const ATTACH_SECRET_FLAGS: SecretFlags = {
  ...GYM_SECRET_FLAGS,
  "--cut-token": { variable: "GYM_CKPT_CUT_TOKEN", moves: (value) => BearerTokenSchema.safeParse(value).success },
};

/** A secret flag at `args[i]` with its value and how many arguments it spans; undefined for anything else, or one the program would refuse as written. */
function secretAt(args: readonly string[], i: number, flags: SecretFlags): { name: string; value: string; width: 1 | 2 } | undefined {
  const arg = args[i]!;
  const equals = arg.indexOf("=");
  const name = equals === -1 ? arg : arg.slice(0, equals);
  if (!Object.hasOwn(flags, name)) return undefined;
  const value = equals === -1 ? args[i + 1] : arg.slice(equals + 1);
  // No value, an empty one (as a variable it would read as unset: the default), or `--nats -x` (ambiguous to parseArgs; `--nats=-x` is a value).
  if (value === undefined || value === "" || (equals === -1 && value.startsWith("-"))) return undefined;
  return { name, value, width: equals === -1 ? 2 : 1 };
}

/**
 * `args` without the secret flags, and the variables that carry their values. The program sees the
 * same settings: a flag beats an inherited variable (the variable is overwritten here), and the
 * last of a flag given twice wins, as node's parseArgs takes it. A flag the program would refuse as
 * written stays on the command line for it to refuse (`secretAt`), and so does every occurrence of a
 * flag one of whose values `moves` keeps: moved, the others would come after it. Nothing after `--` is a flag.
 */
export function secretFlagsToEnv(args: readonly string[], flags: SecretFlags): { args: string[]; env: Record<string, string> } {
  const end = args.includes("--") ? args.indexOf("--") : args.length;
  const staying = new Set<string>();
  for (let i = 0; i < end; i++) {
    const secret = secretAt(args, i, flags);
    if (secret && flags[secret.name]!.moves?.(secret.value) === false) staying.add(secret.name);
  }
  const kept: string[] = [];
  const env: Record<string, string> = {};
  for (let i = 0; i < end; i++) {
    const secret = secretAt(args, i, flags);
    if (!secret || staying.has(secret.name)) {
      kept.push(args[i]!);
      continue;
    }
    env[flags[secret.name]!.variable] = secret.value;
    i += secret.width - 1;
  }
  return { args: [...kept, ...args.slice(end)], env };
}
