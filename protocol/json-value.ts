import { z } from "zod";
import { MAX_JSON_DEPTH } from "./json-depth.js";

/** A JSON value, as records and request bodies carry it. */
export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };

/** An object literal or JSON.parse's result (or a null-prototype object): not an array, a Date or a class instance. */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return false;
  const prototype: unknown = Object.getPrototypeOf(value);
  return prototype === Object.prototype || prototype === null;
}

/** Sets `key` as an own data property: assigning `__proto__` on an ordinary object would set its prototype and drop the key. */
export function setOwnProperty(target: Record<string, unknown>, key: string, value: unknown): void {
  Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
}

const NOT_JSON = Symbol("not JSON");
/** What a refused value was not: says what JSON excludes, as an `[undefined]` is not nested too deep. */
const NOT_JSON_MESSAGE = `expected a JSON value (no undefined, NaN, Infinity, function or class instance) nested at most ${MAX_JSON_DEPTH} levels deep`;

function copyJson(value: unknown, depth: number): JsonValue | typeof NOT_JSON {
  if (value === null || typeof value === "string" || typeof value === "boolean") return value;
  if (typeof value === "number") return Number.isFinite(value) ? value : NOT_JSON;
  if (typeof value !== "object" || depth > MAX_JSON_DEPTH) return NOT_JSON;
  if (Array.isArray(value)) {
    const items: JsonValue[] = [];
    for (const item of value) {
      const copy = copyJson(item, depth + 1);
      if (copy === NOT_JSON) return NOT_JSON;
      items.push(copy);
    }
    return items;
  }
  if (!isPlainObject(value)) return NOT_JSON;
  const entries: Record<string, JsonValue> = {};
  for (const [key, item] of Object.entries(value)) {
    const copy = copyJson(item, depth + 1);
    if (copy === NOT_JSON) return NOT_JSON;
    setOwnProperty(entries, key, copy);
  }
  return entries;
}

/**
 * A JSON value (as zod's `z.json()`: no undefined, NaN, Infinity, function or class instance),
 * nested at most MAX_JSON_DEPTH levels, parsed into a deep copy that keeps every key as data.
 * `z.json()` and `z.record()` build their output by assignment, so a `__proto__` key (JSON.parse
 * makes it an own property) set the copy's prototype instead and vanished from the value.
 */
export const JsonValueSchema = z.unknown().transform((value, ctx): JsonValue => {
  const copy = copyJson(value, 1);
  if (copy !== NOT_JSON) return copy;
  ctx.addIssue({ code: "custom", message: NOT_JSON_MESSAGE });
  return z.NEVER;
});

/**
 * The name a `__proto__` key of `value` is parsed under, so the schema checks its value as it checks
 * any other key's: one none of `value`'s own keys has (a fixed name took over an input key spelled
 * so, its value replaced by the `__proto__` key's).
 */
function protoStandIn(value: Record<string, unknown>): string {
  let name = "\u0000__proto__";
  while (Object.hasOwn(value, name)) name = `\u0000${name}`;
  return name;
}

/**
 * `schema` (an object schema that passes unknown keys through, or a record) with a `__proto__` key
 * of its input kept as data, its value a JSON value (deep-copied) that `schema` accepts as it would
 * under any other name (a record of numbers keeps only a number). zod leaves such a key out of the
 * object it builds (assigned, it would set the prototype), its value unchecked; every other key
 * is `schema`'s output. Its JSON Schema (the OpenAPI document's) is `schema`'s: a transform has none.
 */
export function keepingProtoKey<T extends Record<string, unknown>>(schema: z.ZodType<T>): z.ZodType<T> {
  return z
    .unknown()
    .transform((value, ctx): T => {
      const hasProtoKey = isPlainObject(value) && Object.hasOwn(value, "__proto__");
      const standIn = hasProtoKey ? protoStandIn(value) : undefined;
      const input = hasProtoKey ? renamedKey(value, "__proto__", standIn!) : value;
      const parsed = schema.safeParse(input);
      if (!parsed.success) {
        for (const issue of parsed.error.issues) {
          const path = issue.path.map((part, i) => (i === 0 && part === standIn ? "__proto__" : part));
          ctx.addIssue({ ...issue, path, input: value } as Parameters<typeof ctx.addIssue>[0]);
        }
        return z.NEVER;
      }
      if (!hasProtoKey) return parsed.data;
      const kept = copyJson(value["__proto__"], 2);
      if (kept === NOT_JSON) {
        ctx.addIssue({ code: "custom", path: ["__proto__"], message: NOT_JSON_MESSAGE });
        return z.NEVER;
      }
      // Back under its own name, in the input's key order, then any key the schema added.
      const copy: Record<string, unknown> = {};
      for (const key of Object.keys(value)) {
        if (key === "__proto__") setOwnProperty(copy, key, kept);
        else if (Object.hasOwn(parsed.data, key)) setOwnProperty(copy, key, parsed.data[key]);
      }
      for (const [key, item] of Object.entries(parsed.data)) if (key !== standIn && !Object.hasOwn(copy, key)) setOwnProperty(copy, key, item);
      return copy as T;
    })
    .meta(jsonSchemaOf(schema)) as unknown as z.ZodType<T>;
}

/** `schema`'s JSON Schema as metadata, which z.toJSONSchema merges into the schema it is given on. */
function jsonSchemaOf(schema: z.ZodType): Record<string, unknown> {
  const { $schema: _dialect, ...json } = z.toJSONSchema(schema, { unrepresentable: "any", target: "draft-2020-12" }) as Record<string, unknown>;
  return json;
}

/** A JSON object of any keys (a kind's extras, a manifest's extra), a `__proto__` key kept as data. */
export const JsonObjectSchema = keepingProtoKey(z.record(z.string(), z.unknown()));

/** A shallow copy of `value` with `from` named `to`, in the same key order. */
function renamedKey(value: Record<string, unknown>, from: string, to: string): Record<string, unknown> {
  const copy: Record<string, unknown> = {};
  for (const key of Object.keys(value)) setOwnProperty(copy, key === from ? to : key, value[key]);
  return copy;
}

/**
 * `output` (what a schema parsed `input` into) with each object's keys in `input`'s JSON order,
 * then any key only `output` has (one JSON does not see in the input: a getter, an inherited or a
 * non-enumerable property). zod builds objects in its shape's order, so the JSON of a parsed copy
 * of input spelled in another order would differ from the input's own JSON; this copy's is the
 * same bytes whenever the input's JSON says what was parsed. Copy on write: what is already in
 * order, and what the schema passed through (the same reference), is returned as it is.
 */
export function inInputKeyOrder(output: unknown, input: unknown): unknown {
  if (output === input || output === null || typeof output !== "object" || input === null || typeof input !== "object") return output;
  if (Array.isArray(output)) {
    // An array of scalars (token ids, logprobs) holds nothing to order: not walked item by item.
    // Arrays a schema types hold one kind of item; in an open-ended one objects are passed through.
    if (output.length === 0 || output[0] === null || typeof output[0] !== "object") return output;
    let copy: unknown[] | undefined;
    for (let i = 0; i < output.length; i++) {
      const item: unknown = output[i];
      if (item === null || typeof item !== "object") continue;
      const ordered = inInputKeyOrder(item, Array.isArray(input) ? input[i] : undefined);
      if (ordered !== item) (copy ??= output.slice())[i] = ordered;
    }
    return copy ?? output;
  }
  const target = output as Record<string, unknown>;
  const source = input as Record<string, unknown>;
  const keys = Object.keys(target);
  const inputKeys = Object.keys(source);
  let order = keys;
  if (!inOrder(keys, inputKeys, target)) {
    order = inputKeys.filter((key) => Object.hasOwn(target, key));
    const seen = new Set(order);
    for (const key of keys) if (!seen.has(key)) order.push(key);
  }
  let copy: Record<string, unknown> | undefined = order === keys ? undefined : {};
  for (let i = 0; i < order.length; i++) {
    const key = order[i]!;
    const value = target[key];
    const ordered = value !== null && typeof value === "object" ? inInputKeyOrder(value, source[key]) : value;
    if (copy === undefined && ordered !== value) {
      copy = {};
      for (let k = 0; k < i; k++) assignKey(copy, order[k]!, target[order[k]!]);
    }
    if (copy !== undefined) assignKey(copy, key, ordered);
  }
  return copy ?? output;
}

/** Whether `keys` (of `target`) come in `inputKeys`' order, leaving out input keys `target` lacks: checked without allocating. */
function inOrder(keys: readonly string[], inputKeys: readonly string[], target: object): boolean {
  if (keys.length === inputKeys.length) {
    let i = 0;
    while (i < keys.length && keys[i] === inputKeys[i]) i++;
    if (i === keys.length) return true;
  }
  let same = 0;
  for (const key of inputKeys) {
    if (!Object.hasOwn(target, key)) continue;
    if (keys[same] !== key) return false;
    same++;
  }
  return same === keys.length;
}

/** Assigned (defining every key made copies JSON.stringify wrote slower), but `__proto__` as data. */
function assignKey(target: Record<string, unknown>, key: string, value: unknown): void {
  if (key === "__proto__") setOwnProperty(target, key, value);
  else target[key] = value;
}
