import { context, propagation, type Context, type TextMapGetter } from "@opentelemetry/api";
import type { MsgHdrs } from "@nats-io/transport-node";

const getter: TextMapGetter<MsgHdrs | undefined> = {
  keys: (carrier) => (carrier ? carrier.keys() : []),
  get: (carrier, key) => carrier?.get(key) || undefined,
};

/** The W3C trace context a coordinator put in the NATS headers, so one checkpoint is one trace. */
export function extractTraceContext(headers: MsgHdrs | undefined): Context {
  return propagation.extract(context.active(), headers, getter);
}
