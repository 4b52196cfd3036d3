import {
  CONTROLLER_OPS,
  CheckpointError,
  MAX_CONTROL_MESSAGE_BYTES,
  decodeRequest,
  describeZodError,
  type ControllerOp,
  type CtlReplyOf,
  type CtlRequestOf,
} from "../../protocol/index.js";
import type { CheckpointEngine } from "../engine/checkpoint-engine.js";

/** Validates a controller request (strict zod, no key twice, no integer JSON.parse would round; nothing happens on a refusal) and runs the op. */
export async function dispatchController<O extends ControllerOp>(engine: CheckpointEngine, op: O, body: unknown): Promise<CtlReplyOf<O>> {
  const schema = CONTROLLER_OPS[op].request;
  let request: CtlRequestOf<O>;
  if (typeof body === "string" || body instanceof Uint8Array) {
    // decodeRequest refuses a key named twice and an integer JSON.parse would round (a controller
    // state would come back changed), as the participants' control subjects do.
    request = (isBlank(body) ? parseValue(schema, {}) : decodeRequest(schema, body)) as CtlRequestOf<O>;
  } else {
    request = parseValue(schema, body ?? {}) as CtlRequestOf<O>;
  }
  return (await run(engine, op, request)) as CtlReplyOf<O>;
}

/**
 * Empty or JSON whitespace only (space, tab, LF, CR): `{}`, the same over HTTP (a string) and NATS
 * (bytes). Anything else, a BOM or a no-break space too, goes to the JSON parser, which refuses it.
 * Never past the size limit: the decoder refuses that `payload_too_large`, where `{}` would run an
 * op whose fields are all optional (`checkpoint`).
 */
function isBlank(body: string | Uint8Array): boolean {
  if (body.length > MAX_CONTROL_MESSAGE_BYTES) return false;
  for (let i = 0; i < body.length; i++) {
    const c = typeof body === "string" ? body.charCodeAt(i) : body[i]!;
    if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) return false;
  }
  return true;
}

function parseValue(schema: (typeof CONTROLLER_OPS)[ControllerOp]["request"], value: unknown): unknown {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
  return parsed.data;
}

function run(engine: CheckpointEngine, op: ControllerOp, request: unknown): Promise<unknown> {
  switch (op) {
    case "checkpoint":
      return engine.checkpoint(request as CtlRequestOf<"checkpoint">);
    case "prepare":
      return engine.prepare(request as CtlRequestOf<"prepare">);
    case "commit":
      return engine.commit(request as CtlRequestOf<"commit">);
    case "publish":
      return engine.publish(request as CtlRequestOf<"publish">);
    case "resume":
      return engine.resume(request as CtlRequestOf<"resume">);
    case "renew":
      return engine.renew(request as CtlRequestOf<"renew">);
    case "restore":
      return engine.restore(request as CtlRequestOf<"restore">);
    case "retire":
      return engine.retire(request as CtlRequestOf<"retire">);
    case "forget":
      return engine.forget(request as CtlRequestOf<"forget">);
    case "status":
      return engine.status();
    case "list":
      return engine.list();
    case "get":
      return engine.get(request as CtlRequestOf<"get">);
    default: {
      const never: never = op;
      throw new CheckpointError("invalid_request", `unknown op ${String(never)}`);
    }
  }
}
