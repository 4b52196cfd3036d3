import type { z } from "zod";
import { CheckpointError, describeZodError } from "../../protocol/index.js";

/**
 * One JSON value of a collector state file, checked against its schema. A corrupt file is
 * invalid_checkpoint_state naming `where` (`<file>:<line>`), not a raw SyntaxError/ZodError
 * (internal_error). JSON.parse's own message is not quoted: it may echo the file's text.
 */
export function parseStateValue<S extends z.ZodTypeAny>(schema: S, text: string, where: string): z.output<S> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new CheckpointError("invalid_checkpoint_state", `${where}: not valid JSON`);
  }
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `${where}: ${describeZodError(parsed.error)}`);
  return parsed.data;
}
