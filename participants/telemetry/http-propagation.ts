import diagnostics from "node:diagnostics_channel";
import type { ClientRequest } from "node:http";
import { context, propagation, trace, SpanKind, SpanStatusCode, type Context, type Span } from "@opentelemetry/api";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { SCOPE } from "./instruments.js";

/**
 * Trace context on the reference servers' data plane, without touching their code:
 * - every fastify app created in this process gets a SERVER span per request, parented by the
 *   caller's `traceparent` (fastify publishes each new instance on `fastify.initialization`);
 * - every outgoing fetch (undici) request gets `traceparent` from the active context, and so does
 *   every node:http request where Node announces it before sending its headers
 *   (`http.client.request.created`, Node 22.14 and 23.2 on). Node 20 has no such channel: its
 *   `http.client.request.start` comes once the headers are sent, so a node:http client there adds
 *   trace context itself (the model's generation-cut round).
 * Call once, before the apps are built; returns a function that unsubscribes.
 */
export function propagateHttpTraceContext(): () => void {
  const onFastify = (message: unknown) => instrumentFastify((message as { fastify: FastifyInstance }).fastify);
  const onFetch = (message: unknown) => {
    const request = (message as { request: { addHeader(name: string, value: string): void } }).request;
    for (const [name, value] of Object.entries(injected())) request.addHeader(name, value);
  };
  const onHttpClient = (message: unknown) => {
    const request = (message as { request: ClientRequest }).request;
    if (request.headersSent) return;
    for (const [name, value] of Object.entries(injected())) if (!request.hasHeader(name)) request.setHeader(name, value);
  };
  const subscriptions: [string, (message: unknown) => void][] = [
    ["fastify.initialization", onFastify],
    ["undici:request:create", onFetch],
    ["http.client.request.created", onHttpClient],
  ];
  for (const [name, fn] of subscriptions) diagnostics.subscribe(name, fn);
  return () => {
    for (const [name, fn] of subscriptions) diagnostics.unsubscribe(name, fn);
  };
}

function injected(): Record<string, string> {
  const carrier: Record<string, string> = {};
  if (trace.getSpanContext(context.active())) propagation.inject(context.active(), carrier);
  return carrier;
}

const CONTEXT = Symbol("gym-ckpt.otel.context");
type Traced = FastifyRequest & { [CONTEXT]?: { ctx: Context; span: Span } };

/** SERVER span per request (named `<METHOD> <route template>`); the handler runs in its context. */
export function instrumentFastify(app: FastifyInstance): void {
  const tracer = trace.getTracer(SCOPE);
  app.addHook("onRequest", (request, _reply, done) => {
    const parent = propagation.extract(context.active(), request.headers);
    const route = request.routeOptions.url ?? "unmatched";
    const span = tracer.startSpan(
      `${request.method} ${route}`,
      { kind: SpanKind.SERVER, attributes: { "http.request.method": request.method, "http.route": route } },
      parent,
    );
    const ctx = trace.setSpan(parent, span);
    (request as Traced)[CONTEXT] = { ctx, span };
    context.with(ctx, done);
  });
  // Body parsing runs in the socket's context: enter the request's again before the handler.
  app.addHook("preHandler", (request, _reply, done) => {
    const traced = (request as Traced)[CONTEXT];
    if (traced) context.with(traced.ctx, done);
    else done();
  });
  app.addHook("onResponse", (request, reply, done) => {
    const traced = (request as Traced)[CONTEXT];
    if (traced) {
      traced.span.setAttribute("http.response.status_code", reply.statusCode);
      if (reply.statusCode >= 500) traced.span.setStatus({ code: SpanStatusCode.ERROR });
      traced.span.end();
    }
    done();
  });
  app.addHook("onRequestAbort", (request, done) => {
    const traced = (request as Traced)[CONTEXT];
    traced?.span.setStatus({ code: SpanStatusCode.ERROR, message: "client aborted" });
    traced?.span.end();
    done();
  });
}
