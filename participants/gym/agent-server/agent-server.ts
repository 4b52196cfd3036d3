import Fastify, { type FastifyInstance, type FastifyRequest } from "fastify";
import type { Logger } from "pino";
import { z } from "zod";
import { CheckpointError, captureKey, describeZodError, parseCaptureKey, type EpisodeId } from "../../../protocol/index.js";
import { sendRefusal } from "../../http/http-refusal.js";
import { installJsonBodyParser } from "../../http/json-body.js";
import { installRefusalHandlers, participantServerOptions } from "../../http/refusal-handlers.js";
import type { Activation, AgentKind } from "../../kinds/agent/index.js";
import type { StepEpisode } from "../../kinds/environment/index.js";
import { AgentSessionState } from "./agent-session-state.js";
import { dependencyFailure, trimSlash } from "./gym-http.js";
import { SessionCookieValueSchema } from "./session-cookie-value.js";
import { closeResourcesSession, closeRestoredSession, retiredEpisode, seedSession, verifyAnswer, type OpenResourcesSession } from "./resources-session.js";
import { GymTaskSchema, RunRequestSchema, taskSpellings, type GymTask, type RunReply } from "./gym-task.js";
import { ChatMessageSchema, LoopStateSchema, MAX_ACTIVATE_BODY_BYTES, MAX_SEED_MESSAGES, initialState, runTurnLoop, seededState, type AgentEndpoints, type LoopDriver, type LoopState } from "./tool-calling-agent.js";

/**
 * The reference agent server. Native routes (invoked by the environment server), all under
 * `/ng-rollout/<capture_key>/`:
 *   POST open_session {cookie?}  → {session_key, restored}
 *   POST activate     {task, seed?} → {answer, model_calls, continued, messages}
 *   POST close_session {}        → {}
 * Sent without the prefix they are `rollout_id_required`.
 * Legacy: POST /run {rollout_id, attempt, task} → the agent owns seed, turn loop and verify.
 * `activate` and `/run` answer a callee's refusal as `upstream_failed` (dependencyFailure).
 */
const OpenBodySchema = z.object({ cookie: SessionCookieValueSchema.nullable().optional() }).strict();
/**
 * `seed`: a replayed task's context; the turn loop continues from it behind the agent's own system
 * prompt. A leading system message (a recorded system prompt) is refused: it would stand as a second
 * system prompt after the agent's. The environment never sends one (replay seeds drop the record's
 * leading system message); a system message later in the context is kept as sent.
 */
const SeedSchema = z
  .array(ChatMessageSchema)
  .min(1)
  .max(MAX_SEED_MESSAGES)
  .refine((seed) => seed[0]?.role !== "system", { message: "a seed does not start with a system message: the agent puts its own system prompt first" });
const ActivateBodySchema = z.object({ task: GymTaskSchema, seed: SeedSchema.optional() }).strict();
const EmptyBodySchema = z.object({}).strict();
/** The routes served only under `/ng-rollout/<capture_key>/`. */
const NATIVE_ROUTES = ["open_session", "activate", "close_session"] as const;

/** The legacy episode's own boundary. */
const LegacyBoundarySchema = z.discriminatedUnion("next", [
  z.object({ next: z.literal("loop"), cookie: z.string().nullable(), verify_mode: z.enum(["wait", "replay"]), state: LoopStateSchema }).strict(),
  z.object({ next: z.literal("verify"), cookie: z.string().nullable(), verify_mode: z.enum(["wait", "replay"]), answer: z.string() }).strict(),
  // `cookie`: the verified session's, closed by an episode restored here (absent in older records).
  z.object({ next: z.literal("return"), cookie: z.string().nullable().optional(), answer: z.string(), reward: z.number() }).strict(),
]);
type LegacyBoundary = z.infer<typeof LegacyBoundarySchema>;

/** A restored legacy boundary, or `invalid_checkpoint_state` (checked before the restored record is taken). */
function legacyBoundaryOf(key: string, restored: unknown): LegacyBoundary {
  const parsed = LegacyBoundarySchema.safeParse(restored);
  if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `the restored boundary of ${key} is not a legacy agent boundary`);
  return parsed.data;
}

/** A restored turn-loop state, or `invalid_checkpoint_state` (checked before the activation claims the restored session). */
function turnLoopStateOf(key: string, restored: unknown): LoopState {
  const parsed = LoopStateSchema.safeParse(restored);
  if (!parsed.success) throw new CheckpointError("invalid_checkpoint_state", `the restored boundary of ${key} is not a turn-loop state`);
  return parsed.data;
}

export interface AgentAppOptions {
  kind: AgentKind;
  state: AgentSessionState;
  endpoints: AgentEndpoints;
  episodeTimeoutMs?: number;
  /** Where a legacy episode's failed clean-up of its resources session, and any internal_error a route answers, are reported. */
  logger?: Logger;
}

function parse<T>(schema: z.ZodType<T>, body: unknown): T {
  const parsed = schema.safeParse(body ?? {});
  if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
  return parsed.data;
}

function episodeOf(request: FastifyRequest): EpisodeId {
  const key = (request.params as { key?: string }).key ?? "";
  const episode = parseCaptureKey(key);
  if (!episode) throw new CheckpointError("invalid_request", "the /ng-rollout/ prefix does not hold a valid capture key");
  return episode;
}

export function createAgentApp(options: AgentAppOptions): FastifyInstance {
  const { kind, state, endpoints } = options;
  const app = Fastify({ logger: false, bodyLimit: 1 << 20, ...participantServerOptions(kind.kind) });
  installJsonBodyParser(app);
  // Malformed JSON and the like arrive here; they are the caller's fault.
  const logger = options.logger;
  installRefusalHandlers(app, "agent server", kind.kind, logger);

  app.get("/health", async () => ({ ok: true }));
  app.get("/admin/state", async () => ({ ...kind.statusExtras(), states: kind.sessions.states(), cookies: state.sessions.size }));

  app.post("/ng-rollout/:key/open_session", async (request, reply) => {
    try {
      const episode = episodeOf(request);
      const body = parse(OpenBodySchema, request.body);
      const existed = kind.sessions.has(episode.rollout_id);
      const opened = kind.openSession(episode); // an open session's re-bind changes nothing
      const current = existed ? state.get(episode.rollout_id) : undefined;
      // A re-bind (the same attempt, sent again) keeps the open session's cookie: it is what its
      // activation's tool calls carry and what a commit exports, so another one is refused, not set
      // under a running or parked loop. A restored session keeps its restored state.
      if (!opened.restored && current && body.cookie != null && body.cookie !== current.cookie) {
        throw new CheckpointError("invalid_request", `session ${episode.rollout_id} is open with another cookie; close it first`);
      }
      if (!opened.restored && !current) state.set(episode.rollout_id, { cookie: body.cookie ?? null });
      return { session_key: episode.rollout_id, restored: opened.restored };
    } catch (error) {
      return sendRefusal(reply, error, kind.kind, logger);
    }
  });

  // Its own body limit: a seed carrying the model's reasoning outgrows the 1 MiB of the other routes.
  app.post("/ng-rollout/:key/activate", { bodyLimit: MAX_ACTIVATE_BODY_BYTES }, async (request, reply) => {
    try {
      const episode = episodeOf(request);
      const body = parse(ActivateBodySchema, request.body);
      const key = captureKey(episode);
      const turnLoop = async (activation: Activation) => {
        const restored = activation.continuation();
        const start = restored ? turnLoopStateOf(key, restored) : body.seed ? seededState(body.seed) : initialState(body.task);
        const driver: LoopDriver = {
          signal: activation.signal,
          boundary: (snapshot) => activation.boundary(() => snapshot),
          model: (call) => activation.awaitingModel(call()),
          tool: (call) => activation.awaitingTool(call()),
          park: () => activation.park(),
        };
        const loop = await runTurnLoop(endpoints, key, body.task, state.get(episode.rollout_id)?.cookie ?? null, start, driver);
        return { answer: loop.answer, model_calls: loop.modelCalls, continued: restored !== null, messages: loop.messages };
      };
      // The restored boundary is checked before the session is claimed: a refused activate leaves it restored.
      return await kind.activate(episode, turnLoop, episode.rollout_id, { checkBoundary: (boundary) => void turnLoopStateOf(key, boundary) });
    } catch (error) {
      return sendRefusal(reply, dependencyFailure(error), kind.kind, logger);
    }
  });

  app.post("/ng-rollout/:key/close_session", async (request, reply) => {
    try {
      const episode = episodeOf(request);
      parse(EmptyBodySchema, request.body);
      await kind.closeSession(episode);
      return {};
    } catch (error) {
      return sendRefusal(reply, error, kind.kind, logger);
    }
  });

  // The native routes sent without the prefix: a rollout is what they need, as the model and
  // resources participants answer it; any other path stays not_found.
  for (const route of NATIVE_ROUTES) {
    app.post(`/${route}`, async (_request, reply) =>
      sendRefusal(reply, new CheckpointError("rollout_id_required", `send ${route} under /ng-rollout/<capture_key>/`), kind.kind),
    );
  }

  app.post("/run", async (request, reply) => {
    try {
      const body = parse(RunRequestSchema, request.body);
      const episode = { rollout_id: body.rollout_id, attempt: body.attempt };
      const begin = {
        checkBoundary: (boundary: unknown) => void legacyBoundaryOf(captureKey(episode), boundary),
        // A record digested from another spelling (defaults filled in: checkpoints of older servers) is the same task.
        sameTask: taskSpellings(body.task),
        ...(options.episodeTimeoutMs !== undefined && { timeoutMs: options.episodeTimeoutMs }),
      };
      // Digested as the caller spelled it (defaults not filled in), so `seeds --tasks` finds it in the task file.
      const sent = (request.body as { task: unknown }).task;
      return await kind.runLegacy(episode, sent, begin, (ep) => runLegacyEpisode(endpoints, ep, body.task, options.logger));
    } catch (error) {
      return sendRefusal(reply, dependencyFailure(error), kind.kind, logger);
    }
  });

  return app;
}

/**
 * A legacy episode: seed (replay) → turn loop (model calls replay, tools wait) → verify → return.
 * One that fails before its verify ended its resources session closes it (best effort), unless a
 * retire stopped it: the retire frees it there.
 */
async function runLegacyEpisode(endpoints: AgentEndpoints, ep: StepEpisode, task: GymTask, logger: Logger | undefined): Promise<RunReply> {
  const open: OpenResourcesSession = {};
  try {
    return await runLegacySteps(endpoints, ep, task, open, logger);
  } catch (error) {
    if (open.session && !retiredEpisode(ep)) {
      await closeResourcesSession(ep, trimSlash(endpoints.resourcesUrl), open.session, { logger });
    }
    throw error;
  }
}

async function runLegacySteps(endpoints: AgentEndpoints, ep: StepEpisode, task: GymTask, open: OpenResourcesSession, logger: Logger | undefined): Promise<RunReply> {
  const restored = ep.continuation();
  const continuedFrom = restored ? String(restored.next) : null;
  let boundary = restored ? legacyBoundaryOf(ep.key, restored) : undefined;
  const resources = trimSlash(endpoints.resourcesUrl);
  if (!boundary) {
    open.session = await seedSession(ep, resources, task, open);
    boundary = { next: "loop", ...open.session, state: initialState(task) };
  } else if (boundary.next !== "return") {
    open.session = { cookie: boundary.cookie, verify_mode: boundary.verify_mode };
  }
  if (boundary.next === "loop") {
    const { cookie, verify_mode } = boundary;
    const driver: LoopDriver = {
      signal: ep.signal,
      boundary: (state) => ep.boundary({ next: "loop", cookie, verify_mode, state }),
      model: (call) => ep.step("model", call),
      tool: (call) => ep.step("wait", call),
      park: () => ep.park(),
    };
    const loop = await runTurnLoop(endpoints, ep.key, task, cookie, boundary.state, driver);
    boundary = { next: "verify", cookie, verify_mode, answer: loop.answer };
    await ep.boundary(boundary);
  }
  if (boundary.next === "verify") {
    const { cookie, verify_mode, answer } = boundary;
    const reward = await verifyAnswer(ep, resources, task, { cookie, verify_mode }, answer);
    open.session = undefined; // ended by its verify
    boundary = { next: "return", cookie, answer, reward };
    await ep.boundary(boundary);
  } else if (boundary.cookie) {
    // Restored past its verify: the checkpoint may hold the verified session too, restored with it.
    await closeRestoredSession(ep, resources, boundary.cookie, logger);
  }
  const done = boundary;
  return { rollout_id: ep.id.rollout_id, attempt: ep.id.attempt, reward: done.reward, answer: done.answer, continued_from: continuedFrom };
}
