import type { MsgHdrs, NatsConnection } from "@nats-io/transport-node";

/**
 * A NATS connection for unit tests of a request's headers: every publish is handed to `onPublish`
 * and answered `{}` on its reply subject, on the next microtask.
 */
export function echoNatsConnection(onPublish: (headers: MsgHdrs) => void): NatsConnection {
  let deliver: ((error: null, msg: unknown) => void) | undefined;
  return {
    subscribe: (_subject: string, options: { callback: (error: null, msg: unknown) => void }) => {
      deliver = options.callback;
      return { isClosed: () => false, closed: new Promise(() => undefined) };
    },
    publish: (_subject: string, _body: string, options: { reply: string; headers: MsgHdrs }) => {
      onPublish(options.headers);
      queueMicrotask(() => deliver?.(null, { subject: options.reply, data: new TextEncoder().encode("{}"), headers: undefined, string: () => "{}" }));
    },
    status: async function* () {},
  } as unknown as NatsConnection;
}
