import type { Msg, MsgHdrs, NatsConnection } from "@nats-io/transport-node";

/**
 * A NatsConnection with just what ControlEndpoint and NatsControllerApi use (unit tests only): one
 * queue of messages per subject, and `request(op, headers, body, reply?)` delivering one to the
 * subject ending in `.op`. As nats.js does, a subscription's iterator still yields the messages it
 * had queued when it was unsubscribed.
 */
export function fakeSubscriptions() {
  const queues = new Map<string, { push(msg: Msg): void; close(): void }>();
  const nc = {
    async flush() {},
    subscribe(subject: string) {
      const pending: Msg[] = [];
      let wake: (() => void) | undefined;
      let closed = false;
      queues.set(subject, {
        push(msg) {
          pending.push(msg);
          wake?.();
        },
        close() {
          closed = true;
          wake?.();
        },
      });
      return {
        unsubscribe: () => queues.get(subject)?.close(),
        async *[Symbol.asyncIterator]() {
          for (;;) {
            if (pending.length) yield pending.shift()!;
            else if (closed) return;
            else await new Promise<void>((resolve) => (wake = resolve));
          }
        },
      };
    },
  } as unknown as NatsConnection;
  return {
    nc,
    request(op: string, headers: MsgHdrs, body: string, reply = "inbox"): Promise<string> {
      const subject = [...queues.keys()].find((s) => s.endsWith(`.${op}`))!;
      return new Promise((resolve) => {
        queues.get(subject)!.push({ subject, reply, headers, data: new TextEncoder().encode(body), respond: (data: string) => (resolve(data), true) } as unknown as Msg);
      });
    },
  };
}
