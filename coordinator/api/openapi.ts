import { z } from "zod";
import { CONTROLLER_OPS, CheckpointIdSchema, ERROR_CATALOG, ErrorReplySchema, HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_ID, HEADER_COORDINATOR_SERVED, PROTOCOL_VERSION, controllerOpRefusals, type ControllerOp } from "../../protocol/index.js";

/** HTTP route of each controller op. */
export function httpRoute(op: ControllerOp): { method: "GET" | "POST"; url: string } {
  switch (op) {
    case "status":
      return { method: "GET", url: "/v1/status" };
    case "list":
      return { method: "GET", url: "/v1/checkpoints" };
    case "get":
      return { method: "GET", url: "/v1/checkpoints/{checkpoint_id}" };
    default:
      return { method: "POST", url: `/v1/${op}` };
  }
}

function schemaOf(schema: z.ZodType, io: "input" | "output"): Record<string, unknown> {
  const json = z.toJSONSchema(schema, { io, unrepresentable: "any", target: "draft-2020-12" }) as Record<string, unknown>;
  delete json.$schema;
  return json;
}

/** An op's refusals over HTTP (CONTROLLER_OP_REFUSALS), one response per HTTP status naming its codes. */
function errorResponses(op: ControllerOp): Record<string, unknown> {
  const responses: Record<string, { description: string; content: unknown }> = {};
  for (const code of controllerOpRefusals(op, "http")) {
    const key = String(ERROR_CATALOG[code].status);
    const existing = responses[key];
    responses[key] = {
      description: existing ? `${existing.description}, ${code}` : `Refusal: ${code}`,
      content: { "application/json": { schema: { $ref: "#/components/schemas/ErrorReply" } } },
    };
  }
  return responses;
}

/** The OpenAPI 3.1 document of the HTTP controller API, generated from the zod schemas. */
export function buildOpenApiDocument(): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const op of Object.keys(CONTROLLER_OPS) as ControllerOp[]) {
    const { method, url } = httpRoute(op);
    const spec = CONTROLLER_OPS[op];
    const operation: Record<string, unknown> = {
      operationId: op,
      security: [{ bearer: [] }],
      responses: {
        "200": { description: `${op} reply`, content: { "application/json": { schema: schemaOf(spec.reply, "output") } } },
        ...errorResponses(op),
      },
    };
    if (method === "POST") {
      const schema = schemaOf(spec.request, "input");
      // An absent body is `{}`: optional only for requests whose every field is.
      const required = Array.isArray(schema.required) && schema.required.length > 0;
      operation.requestBody = { required, content: { "application/json": { schema } } };
    }
    if (op === "get") {
      operation.parameters = [{ name: "checkpoint_id", in: "path", required: true, schema: schemaOf(CheckpointIdSchema, "input") }];
    }
    paths[url] = { ...(paths[url] ?? {}), [method.toLowerCase()]: operation };
  }
  // Bodies documented too: a client behind a load balancer compares readyz's epoch between polls;
  // and the headers naming the coordinator that answered: it counts only the refusals of the one
  // that took its op.
  const ok = { type: "boolean", const: true };
  const json = (schema: unknown) => ({ "application/json": { schema } });
  paths["/healthz"] = {
    get: {
      operationId: "healthz",
      responses: { "200": { description: "The process is up", content: json({ type: "object", properties: { ok }, required: ["ok"], additionalProperties: false }) } },
    },
  };
  const term = { type: "string", pattern: "^[0-9]+$" };
  const answeredBy = (epochRequired: boolean) => ({
    [HEADER_COORDINATOR_ID]: { description: "The coordinator that answered (its coordinator_id, percent-encoded as encodeURIComponent does)", required: true, schema: { type: "string", minLength: 1 } },
    [HEADER_COORDINATOR_EPOCH]: {
      description: epochRequired ? "Its leadership term, as the body's epoch" : "The leadership term it holds while not ready yet; absent while it holds none",
      required: epochRequired,
      schema: term,
    },
    [HEADER_COORDINATOR_SERVED]: {
      description: "1 when the term it holds has served the controller API, this HTTP API included (it serves ops once the term recovered; on a 503: a leader stopping gracefully or whose lease renewal lapsed, which may be answering an op; not a new leader waiting out its first lease period); absent otherwise",
      required: false,
      schema: { type: "string", const: "1" },
    },
  });
  paths["/readyz"] = {
    get: {
      operationId: "readyz",
      responses: {
        "200": {
          description: "This coordinator is the ready leader; epoch is its leadership term",
          headers: answeredBy(true),
          content: json({ type: "object", properties: { ok, epoch: { type: "integer", minimum: 0 } }, required: ["ok", "epoch"], additionalProperties: false }),
        },
        "503": { description: "Refusal: not_leader", headers: answeredBy(false), content: json({ $ref: "#/components/schemas/ErrorReply" }) },
      },
    },
  };
  paths["/openapi.json"] = { get: { operationId: "openapi", responses: { "200": { description: "This document" } } } };
  return {
    openapi: "3.1.0",
    info: {
      title: "gym-ckpt coordinator controller API",
      version: `v${PROTOCOL_VERSION}`,
      description: "One POST per op, GET status, list and a checkpoint. Refusals carry a code from the error catalog.",
    },
    paths,
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" } },
      schemas: { ErrorReply: schemaOf(ErrorReplySchema, "output") },
    },
  };
}
