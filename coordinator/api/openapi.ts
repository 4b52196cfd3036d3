import { z } from "zod";
import { CONTROLLER_OPS, CheckpointIdSchema, ERROR_CATALOG, ErrorReplySchema, PROTOCOL_VERSION, ReadyzReadySchema, ReadyzRefusalSchema, controllerOpRefusals, type ControllerOp } from "../../protocol/index.js";

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
  // Bodies documented too: a client behind a load balancer compares readyz's epoch between polls,
  // and counts only the refusals of the coordinator that took its op.
  const ok = { type: "boolean", const: true };
  const json = (schema: unknown) => ({ "application/json": { schema } });
  paths["/healthz"] = {
    get: {
      operationId: "healthz",
      responses: { "200": { description: "The process is up", content: json({ type: "object", properties: { ok }, required: ["ok"], additionalProperties: false }) } },
    },
  };
  paths["/readyz"] = {
    get: {
      operationId: "readyz",
      responses: {
        "200": {
          description: "This coordinator (coordinator_id) is the ready leader; epoch is its leadership term",
          content: json(schemaOf(ReadyzReadySchema, "output")),
        },
        "503": { description: "Refusal: not_leader, naming the coordinator that refused and the term it holds (null: none)", content: json(schemaOf(ReadyzRefusalSchema, "output")) },
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
