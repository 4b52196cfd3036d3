import { z } from "zod";
import { CheckpointError, duplicateJsonKey, envSetting, redactNatsServers } from "../../protocol/index.js";
import { readRegularFileSync } from "../publication/regular-file.js";
import { CoordinatorConfigSchema, SECRET_CONFIG_PATHS, type CoordinatorConfig } from "./coordinator-config.js";

type Plain = Record<string, unknown>;

type EnvType = "string" | "number" | "boolean" | "list";

/** Environment variables → config paths (values are coerced by type, so zod reports bad ones). */
export const CONFIG_ENV: readonly { env: string; path: string; type: EnvType }[] = [
  { env: "GYM_CKPT_DEPLOYMENT", path: "deployment", type: "string" },
  { env: "GYM_CKPT_NATS_URL", path: "nats.servers", type: "string" },
  { env: "GYM_CKPT_NATS_USER", path: "nats.user", type: "string" },
  { env: "GYM_CKPT_NATS_PASS", path: "nats.pass", type: "string" },
  { env: "GYM_CKPT_NATS_TOKEN", path: "nats.token", type: "string" },
  { env: "GYM_CKPT_NATS_CONNECT_WAIT_MS", path: "nats.connect_wait_ms", type: "number" },
  { env: "GYM_CKPT_NATS_CONNECT_TIMEOUT_MS", path: "nats.connect_timeout_ms", type: "number" },
  { env: "GYM_CKPT_TOKEN", path: "token", type: "string" },
  { env: "GYM_CKPT_CONTROLLER_TOKEN", path: "controller_token", type: "string" },
  { env: "GYM_CKPT_CHECKPOINT_ROOT", path: "checkpoint_root", type: "string" },
  { env: "GYM_CKPT_REQUIRE_EXISTING_ROOT_CLAIM", path: "require_existing_root_claim", type: "boolean" },
  { env: "GYM_CKPT_RETENTION", path: "retention", type: "number" },
  { env: "GYM_CKPT_LEASE_MS", path: "lease_ms", type: "number" },
  { env: "GYM_CKPT_DEFAULT_TIMEOUT_MS", path: "default_timeout_ms", type: "number" },
  { env: "GYM_CKPT_REQUEST_SLACK_MS", path: "request_slack_ms", type: "number" },
  { env: "GYM_CKPT_REQUEST_ATTEMPT_MS", path: "request_attempt_ms", type: "number" },
  { env: "GYM_CKPT_REQUEST_PROBE_MS", path: "request_probe_ms", type: "number" },
  { env: "GYM_CKPT_STOP_GRACE_MS", path: "stop_grace_ms", type: "number" },
  { env: "GYM_CKPT_HTTP", path: "http.enabled", type: "boolean" },
  { env: "GYM_CKPT_HTTP_HOST", path: "http.host", type: "string" },
  { env: "GYM_CKPT_HTTP_PORT", path: "http.port", type: "number" },
  { env: "GYM_CKPT_COORDINATOR_ID", path: "coordinator_id", type: "string" },
  { env: "GYM_CKPT_LOG_LEVEL", path: "log_level", type: "string" },
  { env: "GYM_CKPT_EXPECTED_PARTICIPANTS", path: "expected_participants", type: "list" },
];

/** The daemon's flag for each key it requires (no default): "expected string, received undefined at token" alone does not say how to set it. */
const REQUIRED_KEY_FLAGS: Readonly<Record<string, string>> = { token: "--token", checkpoint_root: "--checkpoint-root" };

/** A comma-separated list flag or variable (`resources/r1,model/policy`); blanks around items are dropped. */
export function splitList(value: string): string[] {
  return value
    .split(",")
    .map((item) => item.trim())
    .filter((item) => item !== "");
}

function coerce(value: string, type: EnvType): unknown {
  // Decimal only: Number() would also take `0x10` or `1e3`. Anything else stays a string, which zod reports.
  if (type === "number") return /^\s*-?\d+(\.\d+)?\s*$/.test(value) ? Number(value) : value;
  if (type === "boolean") {
    const parsed = z.stringbool().safeParse(value);
    return parsed.success ? parsed.data : value;
  }
  if (type === "list") return splitList(value);
  return value;
}

function setPath(target: Plain, path: string, value: unknown): void {
  const parts = path.split(".");
  let node = target;
  for (const part of parts.slice(0, -1)) {
    if (typeof node[part] !== "object" || node[part] === null) node[part] = {};
    node = node[part] as Plain;
  }
  node[parts.at(-1)!] = value;
}

function isPlain(value: unknown): value is Plain {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function merge(base: Plain, layer: Plain): Plain {
  const out: Plain = { ...base };
  for (const [key, value] of Object.entries(layer)) {
    if (value === undefined) continue;
    const existing = Object.hasOwn(out, key) ? out[key] : undefined;
    // A lower layer's non-object where the keys of an object go (a config file's `"http": false`
    // or `"nats": "nats://…"`) stays, for the schema to refuse: replaced by the object of a
    // variable or flag setting one of its keys, it was dropped without a word.
    if (isPlain(value) && existing !== undefined && !isPlain(existing)) continue;
    const merged = isPlain(value) && isPlain(existing) ? merge(existing, value) : value;
    // Defined, not assigned: a file's `__proto__` key stays an own key the strict schema refuses, instead of becoming the prototype.
    Object.defineProperty(out, key, { value: merged, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

export function envLayer(env: NodeJS.ProcessEnv): Plain {
  const layer: Plain = {};
  for (const { env: name, path, type } of CONFIG_ENV) {
    const value = envSetting(name, env);
    if (value !== undefined) setPath(layer, path, coerce(value, type));
  }
  return layer;
}

/** A config file larger than this is refused unread: a config is a few lines of JSON. */
export const MAX_CONFIG_FILE_BYTES = 1 << 20;

export function fileLayer(path: string): Plain {
  let bytes: Buffer;
  try {
    // Only a regular file within the limit: a FIFO would block start-up until a writer came (it is
    // opened non-blocking, so it answers at once), a device such as /dev/zero would be read until
    // memory ran out. Symbolic links are followed: mounted configs often are links.
    bytes = readRegularFileSync(path, { maxBytes: MAX_CONFIG_FILE_BYTES }).bytes;
  } catch (error) {
    // Its refusals (not a regular file, too large) name the path; a failed open (ENOENT) is told with the path here.
    if (error instanceof CheckpointError) throw new CheckpointError("invalid_request", `config file ${error.message}`);
    throw new CheckpointError("invalid_request", `cannot read config file ${path}: ${(error as Error).message}`);
  }
  let text: string;
  try {
    // Strict: a lenient decode turns a stray Latin-1 byte into U+FFFD, another root or deployment than the one meant.
    // A leading byte order mark (some editors write one) is dropped, as RFC 8259 allows, not a JSON error.
    text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    throw new CheckpointError("invalid_request", `config file ${path} is not valid UTF-8`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    // Not JSON.parse's message: it quotes the text around the error, which may be a secret.
    throw new CheckpointError("invalid_request", `config file ${path} is not valid JSON`);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw new CheckpointError("invalid_request", `config file ${path} must hold a JSON object`);
  // JSON.parse keeps the last of a key named twice: an edited token or root would be ignored without a word.
  const duplicate = duplicateJsonKey(text);
  if (duplicate !== undefined) throw new CheckpointError("invalid_request", `config file ${path} names the key ${JSON.stringify(duplicate)} twice in one object`);
  return value as Plain;
}

export interface LoadConfigInput {
  /** JSON config file; GYM_CKPT_CONFIG when omitted. */
  file?: string | undefined;
  env?: NodeJS.ProcessEnv;
  /** Already-shaped flag values (dotted paths allowed as keys). */
  flags?: Record<string, unknown>;
}

/** Layers defaults < file < env < flags and validates; errors are readable (z.prettifyError). */
export function loadConfig(input: LoadConfigInput = {}): CoordinatorConfig {
  const env = input.env ?? process.env;
  // An empty --config is a value (no file named), not "no flag": it would silently drop the file GYM_CKPT_CONFIG names.
  if (input.file === "") throw new CheckpointError("invalid_request", "invalid configuration: --config names no file (an empty path)");
  const file = input.file ?? envSetting("GYM_CKPT_CONFIG", env);
  const fromFile = file ? fileLayer(file) : {};
  const fromEnv = envLayer(env);
  const flags: Plain = {};
  for (const [path, value] of Object.entries(input.flags ?? {})) if (value !== undefined) setPath(flags, path, value);
  const merged = merge(merge(merge({}, fromFile), fromEnv), flags);
  const parsed = CoordinatorConfigSchema.safeParse(merged);
  if (!parsed.success) {
    // Which layer set each refused value: "at retention" alone does not say to fix GYM_CKPT_RETENTION.
    // A layer set a value that is no object only if it holds that very value: a flag's or
    // variable's object may lie under a config file's `"http": false`, which the merge kept.
    const sets = (layer: Plain, keys: string[]): boolean => {
      const value = valueAt(merged, keys);
      return hasPath(layer, keys) && (isPlain(value) || Object.is(valueAt(layer, keys), value));
    };
    const sourceOf = (keys: string[]): string | undefined => {
      if (sets(flags, keys)) return "a command-line flag";
      const path = keys.join(".");
      if (sets(fromEnv, keys)) {
        const setting = CONFIG_ENV.find((e) => path === e.path || path.startsWith(`${e.path}.`));
        if (!setting) return "the environment";
        // A number left a string by `coerce` is no decimal: said as a flag's refusal says it (a number is no secret).
        const raw = envSetting(setting.env, env) ?? "";
        return setting.type === "number" && typeof coerce(raw, "number") === "string" ? `${setting.env} (not a decimal number: ${JSON.stringify(raw)})` : setting.env;
      }
      if (sets(fromFile, keys)) return `config file ${file}`;
      return undefined;
    };
    const sources = new Map<string, string>();
    const missing: string[] = [];
    for (const issue of parsed.error.issues) {
      const path = issue.path.join(".");
      const flag = REQUIRED_KEY_FLAGS[path];
      if (flag !== undefined && !hasPath(merged, issue.path.map(String))) {
        const env = CONFIG_ENV.find((e) => e.path === path)!.env;
        missing.push(`  ${path}: pass ${flag} or set ${env} (or "${path}" in a --config file)`);
        continue;
      }
      // The value itself, or the nearest enclosing one a layer set. An unknown key's issue names its
      // object: the layer that set the key itself is asked first, not one that set another key of
      // that object (the environment's nats.user for a file's typo under nats) or nobody (top level).
      const base = issue.path.map(String);
      const targets = issue.code === "unrecognized_keys" ? issue.keys.map((key) => [...base, key]) : [base];
      for (const keys of targets) {
        for (let n = keys.length; n > 0; n--) {
          const source = sourceOf(keys.slice(0, n));
          if (source === undefined) continue;
          sources.set(keys.slice(0, n).join("."), source);
          break;
        }
      }
    }
    const from = [...sources].map(([path, source]) => `  ${path}: ${source}`).join("\n");
    const unset = missing.length > 0 ? `\nnot set:\n${missing.join("\n")}` : "";
    throw new CheckpointError("invalid_request", `invalid configuration:\n${z.prettifyError(parsed.error)}${from ? `\nset by:\n${from}` : ""}${unset}`);
  }
  return parsed.data;
}

function valueAt(values: Plain, keys: string[]): unknown {
  let node: unknown = values;
  for (const key of keys) node = node !== null && typeof node === "object" && Object.hasOwn(node, key) ? (node as Plain)[key] : undefined;
  return node;
}

function hasPath(values: Plain, keys: string[]): boolean {
  let node: unknown = values;
  for (const key of keys) {
    if (node === null || typeof node !== "object" || !Object.hasOwn(node, key)) return false;
    node = (node as Plain)[key];
  }
  return true;
}

/** The config with every secret replaced, for --print-config and logs. */
export function redactConfig(config: CoordinatorConfig): Plain {
  const copy = structuredClone(config) as unknown as Plain;
  for (const path of SECRET_CONFIG_PATHS) {
    const parts = path.split(".");
    let node: Plain | undefined = copy;
    for (const part of parts.slice(0, -1)) node = node?.[part] as Plain | undefined;
    const last = parts.at(-1)!;
    if (node && node[last] !== undefined) node[last] = "[Redacted]";
  }
  const nats = copy.nats as Plain | undefined;
  if (nats && typeof nats.servers === "string") nats.servers = redactNatsServers(nats.servers);
  return copy;
}
