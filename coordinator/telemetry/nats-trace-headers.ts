import { context, propagation, type Context, type TextMapGetter, type TextMapSetter } from "@opentelemetry/api";
import type { MsgHdrs } from "@nats-io/transport-node";

/** W3C trace context in NATS headers, both ways, so one checkpoint is one trace across processes. */
const setter: TextMapSetter<MsgHdrs> = {
  set: (carrier, key, value) => carrier.set(key, value),
};
const getter: TextMapGetter<MsgHdrs | undefined> = {
  keys: (carrier) => (carrier ? carrier.keys() : []),
  get: (carrier, key) => carrier?.get(key) || undefined,
};

export function injectTraceContext(headers: MsgHdrs, ctx: Context = context.active()): void {
  propagation.inject(ctx, headers, setter);
}

export function extractTraceContext(headers: MsgHdrs | undefined): Context {
  return propagation.extract(context.active(), headers, getter);
}
