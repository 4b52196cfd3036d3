import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { PACKAGE_VERSION } from "../../../protocol/index.js";

describe("PACKAGE_VERSION", () => {
  // The version daemons name in their start line and `gym-ckpt --version` prints: the package's own.
  it("is package.json's version", () => {
    const pkg = JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as { version: string };
    expect(PACKAGE_VERSION).toBe(pkg.version);
  });
});
