/**
 * An environment variable's value, an empty one counting as unset: so `GYM_CKPT_DEPLOYMENT=` in an
 * env file shared by the coordinator, the CLI and the Gym servers means the default to all of them.
 */
export function envSetting(name: string, env: Record<string, string | undefined> = process.env): string | undefined {
  const value = env[name];
  return value === "" ? undefined : value;
}
