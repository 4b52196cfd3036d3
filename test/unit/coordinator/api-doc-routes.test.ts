import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { buildOpenApiDocument } from "../../../coordinator/api/openapi.js";
import { CONTROLLER_OP_NAMES, HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_ID, HEADER_COORDINATOR_SERVED, controllerSubject } from "../../../protocol/index.js";

/**
 * docs/api.md names the controller API's HTTP routes, its NATS subjects and the `/readyz` headers a
 * controller author codes against. Each is held to what the coordinator serves: the OpenAPI
 * document's paths (generated from the same routes the HTTP API registers), CONTROLLER_OP_NAMES and
 * the header constants, so an op or route added, renamed or dropped cannot leave the page behind.
 */
const doc = readFileSync(new URL("../../../docs/api.md", import.meta.url), "utf8");
const section = (from: string, to: string) => doc.slice(doc.indexOf(from), doc.indexOf(to, doc.indexOf(from)));
const http = section("## 3. HTTP API", "## 4. CLI");
const nats = section("## 2. NATS API", "## 3. HTTP API");

/** `METHOD /path` of every route the HTTP API table names (a row's first cell may list several paths). */
function documentedRoutes(): string[] {
  const routes: string[] = [];
  for (const [, cell] of http.matchAll(/^\| (`(?:GET|POST) [^|]*) \|/gm)) {
    let method = "";
    for (const [, m, path] of cell!.matchAll(/`(?:(GET|POST) )?(\/[^`]*)`/g)) {
      method = m ?? method; // `POST /v1/checkpoint`, `/v1/prepare`, …: the method carries over
      routes.push(`${method} ${path}`);
    }
  }
  return routes.sort();
}

describe("docs/api.md routes, subjects and headers", () => {
  it("lists exactly the OpenAPI document's routes in the HTTP API table", () => {
    const paths = buildOpenApiDocument().paths as Record<string, Record<string, unknown>>;
    const served = Object.entries(paths).flatMap(([path, methods]) => Object.keys(methods).map((m) => `${m.toUpperCase()} ${path}`));
    expect(documentedRoutes()).toEqual(served.sort());
  });

  it("names every controller op's NATS subject, and no other", () => {
    expect(nats).toContain("`gym.ckpt.v1.<deployment>.ctl.<op>` (`controllerSubject(deployment, op)`)");
    expect(controllerSubject("d", "status")).toBe("gym.ckpt.v1.d.ctl.status");
    const listed = /`controllerSubject\(deployment, op\)`\), for\s+`([^`]+)`/.exec(nats)?.[1]?.split(/,\s*/);
    expect(listed).toEqual([...CONTROLLER_OP_NAMES]);
  });

  it("names the /readyz headers as the protocol defines them", () => {
    const readyz = /^\| `GET \/readyz` \|.*$/m.exec(http)?.[0] ?? "";
    const named = [...readyz.matchAll(/`(Gym-Coordinator-[A-Za-z]+)`/g)].map((m) => m[1]);
    expect(new Set(named)).toEqual(new Set([HEADER_COORDINATOR_ID, HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_SERVED]));
    // Wherever a page names a Gym-Coordinator-* header, it is one of these.
    for (const [, name] of doc.matchAll(/`(Gym-Coordinator-[A-Za-z]+)/g)) expect([HEADER_COORDINATOR_ID, HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_SERVED]).toContain(name);
  });
});
