import { chmodSync, statSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ensurePrivateDir } from "../../../participants/attach/private-dir.js";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow } from "./model-fixtures.js";

// Another local user may plant directories or symlinks in a shared temp dir before the proxy starts.
let base: string;
beforeEach(async () => {
  base = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-dir-"));
});
afterEach(async () => {
  await rm(base, { recursive: true, force: true });
});

describe("the default ledger directory", () => {
  it("is created level by level with mode 0700", () => {
    const dir = ensurePrivateDir(base, ["gym-ckpt-ledger", "dep", "inst"]);
    expect(dir).toBe(join(base, "gym-ckpt-ledger", "dep", "inst"));
    for (const level of [join(base, "gym-ckpt-ledger"), join(base, "gym-ckpt-ledger", "dep"), dir]) expect(statSync(level).mode & 0o777).toBe(0o700);
    expect(ensurePrivateDir(base, ["gym-ckpt-ledger", "dep", "inst"])).toBe(dir); // existing and private: fine
  });

  it("is refused when a level is a symlink, writable by others, or another user's", async () => {
    await mkdir(join(base, "elsewhere"));
    await symlink(join(base, "elsewhere"), join(base, "linked"));
    expect(() => ensurePrivateDir(base, ["linked", "inst"])).toThrow(/linked is not a directory \(a symlink/);
    await mkdir(join(base, "open"));
    chmodSync(join(base, "open"), 0o777);
    expect(() => ensurePrivateDir(base, ["open", "inst"])).toThrow(/open is writable by group or others \(mode 777\)/);
    const owner = statSync(base).uid;
    expect(() => ensurePrivateDir(base, ["mine"], owner + 1)).toThrow(new RegExp(`mine belongs to uid ${owner}, not to this user \\(${owner + 1}\\)`));
  });
});

describe("ledger files", () => {
  it("a symlink planted in a ledger file's place is refused, not written through", async () => {
    const dir = join(base, "ledger");
    await mkdir(dir);
    const victim = join(base, "victim");
    await writeFile(victim, "precious\n");
    await symlink(victim, join(dir, "planted.lineage.jsonl"));
    const ledger = new CaptureLedger(dir);
    try {
      await expect(ledger.append(ledgerRow("planted", "mc-1"))).rejects.toMatchObject({ code: "ELOOP" });
      await expect(ledger.rows("planted")).rejects.toMatchObject({ code: "ELOOP" });
      expect(await readFile(victim, "utf8")).toBe("precious\n");
    } finally {
      await ledger.close();
    }
  });

  it("a rewrite never goes through a symlink planted at a predictable temp name", async () => {
    const dir = join(base, "ledger");
    await mkdir(dir);
    const victim = join(base, "victim");
    await writeFile(victim, "precious\n");
    const ledger = new CaptureLedger(dir);
    try {
      await symlink(victim, join(dir, `.swap.lineage.jsonl.${process.pid}.tmp`)); // the temp name but for its random part
      await ledger.replace("swap", [ledgerRow("swap", "mc-1")]);
      expect(await readFile(victim, "utf8")).toBe("precious\n");
      expect((await readFile(join(dir, "swap.lineage.jsonl"), "utf8")).trim()).toBe(JSON.stringify(ledgerRow("swap", "mc-1")));
      expect(statSync(join(dir, "swap.lineage.jsonl")).mode & 0o777).toBe(0o600);
    } finally {
      await ledger.close();
    }
  });
});

describe("a ledger directory that cannot be made", () => {
  it("is each use's error, not an unhandled rejection that ends the process", async () => {
    const unhandled: unknown[] = [];
    const record = (reason: unknown) => unhandled.push(reason);
    process.on("unhandledRejection", record);
    try {
      const ledger = new CaptureLedger(join("/proc", `gym-ckpt-${process.pid}`, "ledger"));
      // Past the microtask queue: an unobserved rejection is reported by now.
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(unhandled).toEqual([]);
      await expect(ledger.rows("whatever")).rejects.toThrow(/ENOENT/);
    } finally {
      process.off("unhandledRejection", record);
    }
  });
});
