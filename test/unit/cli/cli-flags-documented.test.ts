import { readdirSync, readFileSync } from "node:fs";
import type { Command, Option } from "commander";
import { describe, expect, it } from "vitest";
import { buildProgram } from "../../../coordinator/cli/program.js";
import { CONFIG_ENV } from "../../../coordinator/config/config-loader.js";
import { CoordinatorConfigSchema } from "../../../coordinator/config/coordinator-config.js";

/**
 * The CLI's flags as the docs state them, against the commander definitions they describe: a flag
 * added, renamed or given another default without its page, or a page naming a flag its command no
 * longer takes, sends users to a flag that is refused or a default that is not the one they get.
 * `attach`, `gym` and `seeds` take no commander options (their programs parse their own flags).
 */
const docsDir = new URL("../../../docs/", import.meta.url);
const read = (page: string) => readFileSync(new URL(page, docsDir), "utf8");
const between = (text: string, from: string, to: string) => {
  const start = text.indexOf(from);
  expect(start, from).toBeGreaterThanOrEqual(0);
  const end = text.indexOf(to, start + from.length);
  return text.slice(start, end < 0 ? undefined : end);
};

const api = read("api.md");
const collect = read("collect.md");
const cliSection = between(api, "## 4. CLI", "## 5. Configuration");
const configSection = between(api, "## 5. Configuration", "## High availability");

const program = await buildProgram();
const commands = new Map(program.commands.map((c) => [c.name(), c]));
const command = (name: string): Command => commands.get(name)!;
const longFlags = (c: Command): string[] => c.options.map((o) => o.long!);

/** Where each command's flags are documented (the section that owns them). */
const CLIENT_COMMANDS = ["checkpoint", "commit", "forget", "ls", "prepare", "publish", "renew", "restore", "resume", "retire", "status", "verify"];
const PAGE_OF: Record<string, string> = {
  ...Object.fromEntries(CLIENT_COMMANDS.map((name) => [name, cliSection])),
  coordinator: `${cliSection}\n${configSection}`,
  collect,
  demo: between(collect, "## The demo", "\n## "),
};

const named = (text: string, flag: string) => new RegExp(`${flag}(?![a-z0-9-])`).test(text);

/** The rows of the flag tables in `text`: `| \`--flag\` | default | meaning |`. */
function flagRows(text: string): Map<string, string> {
  return new Map([...text.matchAll(/^\| `(--[a-z0-9-]+)` \| ([^|]*) \|/gm)].map((m) => [m[1]!, m[2]!.trim()]));
}

/** A commander default as a table writes it: none is "off" or "—". */
function documentedDefault(option: Option): string[] {
  const value = option.defaultValue as unknown;
  if (value === undefined || value === false || value === "") return ["off", "—"];
  return [String(value), `\`${String(value)}\``];
}

describe("CLI flags in the docs", () => {
  it("knows the page of every command that takes flags", () => {
    for (const c of program.commands) if (c.options.length > 0) expect(Object.keys(PAGE_OF), c.name()).toContain(c.name());
  });

  it("names every flag of every command on its page", () => {
    const missing = Object.entries(PAGE_OF).flatMap(([name, page]) => longFlags(command(name)).filter((flag) => !named(page, flag)).map((flag) => `${name} ${flag}`));
    expect(missing).toEqual([]);
  });

  it("gives collect's flags with a default a table row stating it (docs/collect.md)", () => {
    const rows = flagRows(collect);
    for (const option of command("collect").options) {
      if (option.defaultValue === undefined) continue;
      expect(rows.has(option.long!), `collect ${option.long} has a row`).toBe(true);
      expect(documentedDefault(option), `collect ${option.long} default`).toContain(rows.get(option.long!));
    }
    // No row for a flag collect does not take.
    for (const flag of rows.keys()) expect(longFlags(command("collect")), flag).toContain(flag);
  });

  it("states the client commands' --leader-wait-ms default as commander has it (docs/api.md §4)", () => {
    const stated = /`--leader-wait-ms MS` \(default (\d+)\)/.exec(cliSection)?.[1];
    for (const name of CLIENT_COMMANDS.filter((n) => longFlags(command(n)).includes("--leader-wait-ms"))) {
      expect([name, stated]).toEqual([name, command(name).options.find((o) => o.long === "--leader-wait-ms")!.defaultValue]);
    }
  });

  it("lists in §4's command table only flags each command takes", () => {
    const rows = [...cliSection.matchAll(/^\| `gym-ckpt ([a-z]+)([^`]*)`(?: \/ `([a-z]+)([^`]*)`)? \|/gm)];
    expect(rows.length).toBeGreaterThan(8);
    for (const row of rows) {
      for (const [name, usage] of [[row[1], row[2]], [row[3], row[4]]] as const) {
        if (name === undefined) continue;
        const known = longFlags(command(name));
        for (const [flag] of (usage ?? "").matchAll(/--[a-z0-9-]+/g)) expect(known, `gym-ckpt ${name} ${flag}`).toContain(flag);
      }
    }
  });

  it("states §5's config table as the loader reads it: variable, flag and default of every key", () => {
    const rows = [...configSection.matchAll(/^\| (`[a-z_.]+`[^|]*) \| ([^|]*) \| ([^|]*) \| ([^|]*) \|$/gm)];
    // The required keys' values given here are not defaults: they have none.
    const required = { token: "t", checkpoint_root: "/r" };
    const defaults = { ...(CoordinatorConfigSchema.parse(required) as Record<string, unknown>), token: undefined, checkpoint_root: undefined };
    const valueAt = (path: string) => path.split(".").reduce<unknown>((v, k) => (v as Record<string, unknown> | undefined)?.[k], defaults);
    const coordinatorFlags = longFlags(command("coordinator"));
    const documentedPaths: string[] = [];
    for (const [, keyCell, envCell, flagCell, defaultCell] of rows) {
      // A row may hold several keys (`http.enabled` / `http.host` / `http.port`), each cell then one per key.
      const keys = [...keyCell!.replace(/\(.*$/, "").matchAll(/`([a-z_.]+)`/g)].map((m) => m[1]!);
      const prefix = /`(GYM_CKPT_[A-Z_]+)`/.exec(envCell!)?.[1] ?? "";
      const envs = [...envCell!.matchAll(/`([A-Z_…]+)`/g)].map((m) => m[1]!.replace(/^…_/, prefix.replace(/_[A-Z]+$/, "_")).replace(/^_/, "GYM_CKPT_"));
      const flags = flagCell!.trim() === "—" ? [] : [...flagCell!.matchAll(/`(--[a-z-]+)/g)].map((m) => m[1]!);
      const shownDefaults = keys.length > 1 ? defaultCell!.split(" / ").map((d) => d.trim()) : [defaultCell!.trim()];
      keys.forEach((key, i) => {
        documentedPaths.push(key);
        expect([key, envs[i]]).toEqual([key, CONFIG_ENV.find((e) => e.path === key)?.env]);
        if (flags.length > 0) expect(coordinatorFlags, `${key}: ${flags[i]}`).toContain(flags[i]);
        const value = valueAt(key);
        // Keys without a schema default state what stands in for one (`token`, `<host>-<pid>-<random>`, —).
        if (value !== undefined && shownDefaults[i] !== undefined && shownDefaults.length === keys.length) {
          expect([key, shownDefaults[i]!.replace(/`/g, "")]).toEqual([key, String(value)]);
        }
      });
    }
    // Every key a variable sets has its row, so no setting is undocumented.
    expect([...documentedPaths].sort()).toEqual(CONFIG_ENV.map((e) => e.path).sort());
  });

  it("uses in every `gym-ckpt <command>` example only flags that command takes", () => {
    const pages = readdirSync(docsDir).filter((n) => n.endsWith(".md") && n !== "benchmarks.md");
    const texts = [...pages.map((page) => [`docs/${page}`, read(page)] as const), ["README.md", readFileSync(new URL("../../../README.md", import.meta.url), "utf8")] as const];
    let checked = 0;
    for (const [page, raw] of texts) {
      const text = raw.replace(/\\\n\s*/g, " "); // a shell line continued on the next
      for (const m of text.matchAll(/(?:gym-ckpt|cli\/main\.js) ([a-z]+)((?: +(?:\[?--?[a-z][a-z0-9-]*(?:[ =](?!-)[^\s`|\]]+)?\]?|[^\s`|-][^\s`|]*))*)/g)) {
        const c = commands.get(m[1]!);
        if (!c || c.options.length === 0) continue;
        const known = [...longFlags(c), "--help"];
        for (const [flag] of m[2]!.matchAll(/(?<![\w-])--[a-z][a-z0-9-]*/g)) {
          checked++;
          expect(known, `${page}: ${m[0].slice(0, 100)}`).toContain(flag);
        }
      }
    }
    expect(checked).toBeGreaterThan(20);
  });
});
