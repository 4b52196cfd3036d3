import Fastify, { type FastifyInstance } from "fastify";
import { installJsonBodyParser } from "../../http/json-body.js";
import { closeQueuedResponsesWithConnection } from "../../http/queued-response-close.js";
import { installRefusalHandlers, participantServerOptions } from "../../http/refusal-handlers.js";
import type { JsonValue } from "./json-value.js";
import { ResourcesKind, type ResourcesKindOptions } from "./resources-kind.js";
import { installResourcesCheckpointing, type SessionAccess } from "./resources-middleware.js";
import { CheckpointModeSchema, CheckpointVerifySchema, type CheckpointMode, type CheckpointVerify } from "./resources-modes.js";
import type { ResourcesSessionHooks } from "./resources-session-hooks.js";

/**
 * Base class of an HTTP resources server. Subclasses declare what their code can do on the class:
 *
 *   class Calculator extends ResourcesServer {
 *     static override readonly checkpointMode = "stateless";
 *     static override readonly checkpointVerify = "replay";
 *     routes(app, sessions) { app.post("/seed_session", ...); ... }
 *   }
 *
 * Routes are registered under `/ng-rollout/:capture_key`. `exported` servers also implement the
 * session hooks (export / restore / retire, optional park).
 */
export abstract class ResourcesServer implements Partial<ResourcesSessionHooks> {
  /** Fails closed: a server nobody audited is restarted from input after a crash. */
  static readonly checkpointMode: CheckpointMode = "restart_only";
  static readonly checkpointVerify: CheckpointVerify = "wait";

  abstract routes(app: FastifyInstance, sessions: SessionAccess): void | Promise<void>;

  exportSessionStates?(sessionIds: string[]): Promise<Record<string, JsonValue>>;
  restoreSessionStates?(states: Record<string, JsonValue>): Promise<void>;
  retireSessionState?(sessionId: string): Promise<void>;
  parkSessionStates?(sessionIds: string[]): Promise<void>;
}

/** The kind's `owner`, `logger`, `replayableEndHoldMs`, `unusedSeedLifetimeMs` and `clock` (see ResourcesKindOptions), and the app's body limit. */
export interface ResourcesAppOptions extends Pick<ResourcesKindOptions, "owner" | "logger" | "replayableEndHoldMs" | "unusedSeedLifetimeMs" | "clock"> {
  bodyLimit?: number;
}

export interface ResourcesApp {
  app: FastifyInstance;
  kind: ResourcesKind;
  sessions: SessionAccess;
}

/** The declarations of a server instance's class, validated. */
export function declarationsOf(server: ResourcesServer): { mode: CheckpointMode; verify: CheckpointVerify } {
  const ctor = server.constructor as typeof ResourcesServer;
  return { mode: CheckpointModeSchema.parse(ctor.checkpointMode), verify: CheckpointVerifySchema.parse(ctor.checkpointVerify) };
}

/** Builds the fastify app with the checkpoint middleware in front of the server's routes. */
export async function createResourcesApp(server: ResourcesServer, options: ResourcesAppOptions = {}): Promise<ResourcesApp> {
  const { mode, verify } = declarationsOf(server);
  const hooks: Partial<ResourcesSessionHooks> = {};
  if (server.exportSessionStates) hooks.exportSessionStates = server.exportSessionStates.bind(server);
  if (server.restoreSessionStates) hooks.restoreSessionStates = server.restoreSessionStates.bind(server);
  if (server.retireSessionState) hooks.retireSessionState = server.retireSessionState.bind(server);
  if (server.parkSessionStates) hooks.parkSessionStates = server.parkSessionStates.bind(server);
  const kind = new ResourcesKind({
    mode,
    verify,
    hooks,
    owner: options.owner ?? null,
    ...(options.logger && { logger: options.logger }),
    ...(options.replayableEndHoldMs !== undefined && { replayableEndHoldMs: options.replayableEndHoldMs }),
    ...(options.unusedSeedLifetimeMs !== undefined && { unusedSeedLifetimeMs: options.unusedSeedLifetimeMs }),
    ...(options.clock && { clock: options.clock }),
  });
  const app = Fastify({
    // A path that does not decode (e.g. `/ng-rollout/%E0/…`) is refused by the router before any hook.
    ...participantServerOptions(kind.kind),
    logger: false,
    bodyLimit: options.bodyLimit ?? 1024 * 1024,
  });
  // JSON only: Fastify's text/plain parser would hand a route a string body. Another content type
  // is then 415, answered invalid_request before any route runs.
  app.removeAllContentTypeParsers();
  installJsonBodyParser(app);
  // Once closed, the holds of verified sessions fire no timer into the server (ResourcesKind.dispose).
  app.addHook("onClose", async () => kind.dispose());
  installRefusalHandlers(app, "resources server", kind.kind, options.logger);
  // The middleware releases a streamed or hijacked reply's request on its response's 'close'.
  closeQueuedResponsesWithConnection(app.server);
  const sessions = installResourcesCheckpointing(app, kind);
  await app.register(async (scope) => server.routes(scope, sessions), { prefix: "/ng-rollout/:capture_key" });
  return { app, kind, sessions };
}
