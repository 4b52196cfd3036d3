import { describe, expect, it } from "vitest";
import { buildOpenApiDocument, httpRoute } from "../../../coordinator/api/openapi.js";
import { CONTROLLER_OP_NAMES, ERROR_CATALOG, controllerOpRefusals } from "../../../protocol/index.js";

type Operation = { responses: Record<string, { description: string }> };
const doc = buildOpenApiDocument() as { paths: Record<string, Record<string, Operation>> };

/** The refusal codes an operation documents, and the HTTP status each is filed under. */
function documentedRefusals(path: string, method: string): Map<string, string> {
  const codes = new Map<string, string>();
  for (const [status, response] of Object.entries(doc.paths[path]![method]!.responses)) {
    const names = /^Refusals?: (.+)$/.exec(response.description)?.[1];
    for (const code of names?.split(", ") ?? []) codes.set(code, status);
  }
  return codes;
}

describe("OpenAPI: each operation documents its own refusals", () => {
  it("status and list offer none of another op's codes (prepare_incomplete, restore_failed, journal_unavailable)", () => {
    for (const [path, method] of [
      ["/v1/status", "get"],
      ["/v1/checkpoints", "get"],
    ] as const) {
      const codes = [...documentedRefusals(path, method).keys()];
      for (const code of ["prepare_incomplete", "restore_failed", "journal_unavailable", "restart_in_scope"]) expect([path, code, codes.includes(code)]).toEqual([path, code, false]);
    }
  });

  it("list documents exactly its own storage_error and the refusals every op can answer over HTTP, each under its catalog status", () => {
    const codes = documentedRefusals("/v1/checkpoints", "get");
    expect([...codes.keys()].sort()).toEqual(["internal_error", "invalid_request", "not_leader", "outcome_unknown", "payload_too_large", "storage_error", "unauthorized"]);
    for (const [code, status] of codes) expect([code, status]).toEqual([code, String(ERROR_CATALOG[code as keyof typeof ERROR_CATALOG].status)]);
  });
});

describe("OpenAPI: generated from CONTROLLER_OP_REFUSALS", () => {
  it("documents for every op exactly the codes the table gives it over HTTP, never reply_too_large, one response per catalog status", () => {
    for (const op of CONTROLLER_OP_NAMES) {
      const { method, url } = httpRoute(op);
      const codes = documentedRefusals(url, method.toLowerCase());
      expect([op, [...codes.keys()].sort()]).toEqual([op, controllerOpRefusals(op, "http").sort()]);
      expect([op, codes.has("reply_too_large")]).toEqual([op, false]);
      for (const [code, status] of codes) expect([op, code, status]).toEqual([op, code, String(ERROR_CATALOG[code as keyof typeof ERROR_CATALOG].status)]);
      // Valid OpenAPI 3: every response keyed by a status code and described.
      for (const [status, response] of Object.entries(doc.paths[url]![method.toLowerCase()]!.responses)) {
        expect([op, status]).toEqual([op, expect.stringMatching(/^[1-5]\d\d$/)]);
        expect(response.description).toEqual(expect.any(String));
      }
    }
  });

  it("deadline_exceeded only for ops that take a deadline_ts; the participants' codes only for ops that send to participants", () => {
    expect(controllerOpRefusals("publish", "http")).not.toContain("deadline_exceeded");
    expect(controllerOpRefusals("get", "http")).not.toContain("deadline_exceeded");
    expect(controllerOpRefusals("prepare", "http")).toContain("deadline_exceeded");
    expect(controllerOpRefusals("resume", "http")).toContain("stale_epoch");
    expect(controllerOpRefusals("get", "http")).not.toContain("stale_epoch");
    expect(controllerOpRefusals("list", "nats")).toContain("reply_too_large");
  });
});
