import { mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { claimRootForDeployment } from "../../../coordinator/publication/root-deployment.js";
import { ROOT_DEPLOYMENT_FILE } from "../../../protocol/index.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-root-deployment-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("claimRootForDeployment", () => {
  it("the first start claims the root; the same deployment starts again on it, another is refused naming both", async () => {
    await claimRootForDeployment(root, "job");
    expect(JSON.parse(await readFile(join(root, ROOT_DEPLOYMENT_FILE), "utf8"))).toEqual({ deployment: "job" });
    await claimRootForDeployment(root, "job");
    for (const other of ["job-1", "Job", "jo"]) {
      const refusal = await refusalOf(claimRootForDeployment(root, other));
      expect(refusal.code, other).toBe("invalid_request");
      expect(refusal.message, other).toContain(`deployment "job"`);
      expect(refusal.message, other).toContain(`"${other}"`);
    }
    expect(await readdir(root)).toEqual([ROOT_DEPLOYMENT_FILE]); // no temp file left
  });

  it("of two deployments starting at once on a fresh root, exactly one claims it", async () => {
    const outcomes = await Promise.allSettled(["a", "b", "a", "b", "a", "b"].map((deployment) => claimRootForDeployment(root, deployment)));
    const owner = (JSON.parse(await readFile(join(root, ROOT_DEPLOYMENT_FILE), "utf8")) as { deployment: string }).deployment;
    expect(outcomes.map((o) => o.status)).toEqual(["a", "b", "a", "b", "a", "b"].map((d) => (d === owner ? "fulfilled" : "rejected")));
    expect(await readdir(root)).toEqual([ROOT_DEPLOYMENT_FILE]);
  });

  it.each([
    ["not JSON", "job"],
    ["another shape", JSON.stringify({ deployment: "job", extra: 1 })],
    ["a deployment no coordinator can have", JSON.stringify({ deployment: "a.b" })],
  ])("a file that is %s is invalid_request naming it, and is left as found", async (_what, text) => {
    await writeFile(join(root, ROOT_DEPLOYMENT_FILE), text);
    const refusal = await refusalOf(claimRootForDeployment(root, "job"));
    expect(refusal.code).toBe("invalid_request");
    expect(refusal.message).toContain(join(root, ROOT_DEPLOYMENT_FILE));
    expect(await readFile(join(root, ROOT_DEPLOYMENT_FILE), "utf8")).toBe(text);
  });

  it("a symbolic link in its place is refused, not followed", async () => {
    await writeFile(join(root, "elsewhere.json"), JSON.stringify({ deployment: "job" }));
    await symlink(join(root, "elsewhere.json"), join(root, ROOT_DEPLOYMENT_FILE));
    const refusal = await refusalOf(claimRootForDeployment(root, "job"));
    expect(refusal.code).toBe("invalid_request");
    expect(refusal.message).toMatch(/symbolic link/);
  });
});
