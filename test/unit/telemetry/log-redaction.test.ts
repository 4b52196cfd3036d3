import { spawnSync } from "node:child_process";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { createLogger } from "../../../coordinator/telemetry/logger.js";
import { LOG_REDACT_CENSOR, LOG_REDACT_PATHS } from "../../../protocol/index.js";
import { ensureBuilt } from "../../e2e/coordinator-process.js";

/** One object with every kind of secret the processes hold, at the depths they are logged at. */
const SECRETS = {
  token: "s-top-token",
  controller_token: "s-top-controller",
  config: {
    token: "s-config-token",
    controller_token: "s-config-controller",
    nats: { pass: "s-nats-pass", token: "s-nats-token", user: "kept-user" },
  },
  nats: { pass: "s-flat-pass", password: "s-flat-password" },
  password: "s-top-password",
  extra: { "cut-token": "s-extra-cut-token", upstream: "kept-upstream" },
  options: { cutToken: "s-cut-token", controlToken: "s-control-token", tokenDelayMs: 5 },
  cutBackend: { root: "kept-root", token: "s-backend-token" },
  headers: { authorization: "Bearer s-auth", cookie: "ng_session=s-cookie", "x-api-key": "s-api-key", "content-type": "kept-type" },
  req: { headers: { authorization: "Bearer s-req-auth", cookie: "s-req-cookie", "x-api-key": "s-req-api-key", "set-cookie": "s-set-cookie" } },
  request: { Authorization: "Bearer s-capital-auth" },
  upstream: { headers: { Cookie: "s-capital-cookie", "X-Api-Key": "s-capital-api-key", "Proxy-Authorization": "Basic s-capital-proxy", "Set-Cookie": "s-capital-set-cookie" } },
  judge: { apiKey: "s-judge-api-key", api_key: "s-judge-api-key-snake", url: "kept-judge-url" },
  err: { message: "kept-message", config: { url: "http://x/s-err-url", headers: { authorization: "Bearer s-err-auth" }, token: "s-err-token" } },
};

function capture(make: (destination: { write(line: string): void }) => pino.Logger): string {
  const lines: string[] = [];
  const logger = make({ write: (line) => lines.push(line) });
  logger.info(SECRETS, "secrets");
  logger.child({ config: { token: "s-child-token" }, cutToken: "s-child-cut" }).info("child bindings");
  return lines.join("");
}

function expectRedacted(text: string): void {
  expect(text).toContain(LOG_REDACT_CENSOR);
  expect(text.match(/s-[a-z-]+/g) ?? []).toEqual([]);
  for (const kept of ["kept-user", "kept-upstream", "kept-judge-url", "kept-root", "kept-type", "kept-message"]) expect(text).toContain(kept);
}

describe("log redaction", () => {
  it("the shared path list censors every token, password, credential header and err.config", () => {
    expectRedacted(capture((destination) => pino({ redact: { paths: [...LOG_REDACT_PATHS], censor: LOG_REDACT_CENSOR } }, destination)));
  });

  it("the coordinator's logger uses it", () => {
    expectRedacted(capture((destination) => createLogger("info", destination)));
  });

  it("the replay library's fallback logger uses it and carries the active span's trace id", () => {
    // It writes to stdout itself: run it in a process of its own (the built library).
    ensureBuilt();
    const script = `
      import { context, trace } from "@opentelemetry/api";
      import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
      import { BasicTracerProvider } from "@opentelemetry/sdk-trace-base";
      import { defaultLogger } from "./dist/participants/replay/log.js";
      context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
      trace.setGlobalTracerProvider(new BasicTracerProvider());
      const span = trace.getTracer("t").startSpan("s");
      const secrets = ${JSON.stringify(SECRETS)};
      context.with(trace.setSpan(context.active(), span), () => defaultLogger().info(secrets, "secrets"));
      process.stderr.write(span.spanContext().traceId);
    `;
    const run = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: 20_000 });
    expect([run.status, run.signal], run.stderr).toEqual([0, null]);
    expectRedacted(run.stdout);
    expect(JSON.parse(run.stdout.trim())).toMatchObject({ msg: "secrets", trace_id: run.stderr });
  });
});
