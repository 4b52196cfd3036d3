import Fastify, { type FastifyInstance } from "fastify";
import { CheckpointError, describeZodError } from "../../../protocol/index.js";
import { sendRefusal } from "../../http/http-refusal.js";
import type { EnvironmentKind } from "../../kinds/environment/index.js";
import { RunRequestSchema } from "../agent-server/gym-task.js";
import { runGymEpisode, type GymEndpoints } from "./gym-episode.js";

/**
 * The reference environment server: `POST /run {rollout_id, attempt, task}` → seed → agent →
 * verify → `{rollout_id, attempt, reward, answer, continued_from}`. Refusals carry catalog codes:
 * `admission_closed` while a checkpoint is open, `stale_attempt` for retired or conflicting
 * attempts, `invalid_request` for a task that differs from the restored one.
 */
export interface EnvironmentAppOptions {
  kind: EnvironmentKind;
  endpoints: GymEndpoints;
  episodeTimeoutMs?: number;
}

export function createEnvironmentApp(options: EnvironmentAppOptions): FastifyInstance {
  const { kind, endpoints } = options;
  const app = Fastify({ logger: false, bodyLimit: 1 << 20 });
  app.setErrorHandler((error, _request, reply) =>
    sendRefusal(reply, error instanceof CheckpointError ? error : new CheckpointError("invalid_request", error instanceof Error ? error.message : String(error))),
  );
  app.get("/health", async () => ({ ok: true }));
  app.get("/admin/state", async () => ({ ...kind.statusExtras(), states: kind.episodes.steps.states() }));
  app.post("/run", async (request, reply) => {
    try {
      const parsed = RunRequestSchema.safeParse(request.body ?? {});
      if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
      const body = parsed.data;
      const episode = { rollout_id: body.rollout_id, attempt: body.attempt };
      return await kind.begin(episode, body.task, options.episodeTimeoutMs !== undefined ? { timeoutMs: options.episodeTimeoutMs } : {}, (ep) =>
        runGymEpisode(endpoints, ep, body.task),
      );
    } catch (error) {
      return sendRefusal(reply, error);
    }
  });
  return app;
}
