import { rolloutPath } from "../../../protocol/index.js";
import type { StepEpisode } from "../../kinds/environment/index.js";
import { expectOk, postJson, sessionCookieFrom } from "./gym-http.js";
import type { GymTask } from "./gym-task.js";

/** What an episode keeps of its seeded session: the cookie the resources server set, and how its verify runs. */
export interface SeededSession {
  cookie: string | null;
  verify_mode: "replay" | "wait";
}

/**
 * The `replay` step that starts every reference episode (legacy agent loop and Gym environment
 * alike): the resources server seeds the rollout's session. It may say this rollout is a restart
 * (its earlier attempt was lost), which the episode records before going on.
 */
export async function seedSession(ep: StepEpisode, resourcesUrl: string, task: GymTask): Promise<SeededSession> {
  const seeded = await ep.step("replay", async (signal) => {
    const response = await postJson(`${resourcesUrl}${rolloutPath(ep.key, "/seed_session")}`, { task }, { signal });
    expectOk("seed_session", response);
    return {
      cookie: sessionCookieFrom(response.headers) ?? null,
      verify: response.headers.get("x-ng-checkpoint-verify") === "replay" ? ("replay" as const) : ("wait" as const),
      restart: response.headers.get("x-ng-checkpoint-restart") === "1",
    };
  });
  if (seeded.restart) await ep.markRestart();
  return { cookie: seeded.cookie, verify_mode: seeded.verify };
}
