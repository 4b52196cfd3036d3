import { describe, expect, it } from "vitest";
import type { FastifyInstance } from "fastify";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";
import { CalculatorServer } from "../../../participants/gym/resources-server/calculator-server.js";

/**
 * The Gym participant servers refuse a body JSON.parse would read without a word, as the control
 * subjects do: a key named twice (JSON.parse keeps the last: `"attempt":0,"attempt":1` ran attempt 1).
 */
describe("Gym participant servers: JSON bodies", () => {
  const servers: { name: string; url: string; make: () => Promise<{ app: FastifyInstance; untouched: () => void }> }[] = [
    {
      name: "environment",
      url: "/run",
      make: async () => {
        const kind = new EnvironmentKind();
        const app = createEnvironmentApp({ kind, endpoints: { agentUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9" } });
        return { app, untouched: () => expect(kind.episodes.steps.size).toBe(0) };
      },
    },
    {
      name: "agent",
      url: "/ng-rollout/r1-a1/open_session",
      make: async () => {
        const state = new AgentSessionState();
        const kind = new AgentKind(state);
        const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9", stream: false } });
        return { app, untouched: () => expect(state.sessions.size).toBe(0) };
      },
    },
    {
      name: "resources",
      url: "/ng-rollout/r1-a1/seed_session",
      make: async () => {
        const calculator = new CalculatorServer();
        const { app } = await createResourcesApp(calculator);
        return { app, untouched: () => expect(calculator.controls.stats.seeds).toBe(0) };
      },
    },
  ];

  for (const server of servers) {
    it(`the ${server.name} server refuses a key named twice with invalid_request naming it, and does nothing`, async () => {
      const { app, untouched } = await server.make();
      try {
        const res = await app.inject({
          method: "POST",
          url: server.url,
          headers: { "content-type": "application/json" },
          payload: '{"rollout_id":"r1","attempt":1,"attempt":2,"task":{"expression":"1+1"}}',
        });
        expect(res.statusCode).toBe(400);
        expect(res.json()).toMatchObject({ error: { code: "invalid_request" } });
        expect(res.json().error.detail).toContain('"attempt" appears twice');
        untouched();
      } finally {
        await app.close();
      }
    });

    it(`the ${server.name} server refuses malformed JSON and nesting past the limit with invalid_request`, async () => {
      const { app, untouched } = await server.make();
      try {
        for (const payload of ['{"rollout_id":', `{"a":${"[".repeat(200)}${"]".repeat(200)}}`]) {
          const res = await app.inject({ method: "POST", url: server.url, headers: { "content-type": "application/json" }, payload });
          expect(res.statusCode).toBe(400);
          expect(res.json()).toMatchObject({ error: { code: "invalid_request" } });
        }
        untouched();
      } finally {
        await app.close();
      }
    });
  }
});
