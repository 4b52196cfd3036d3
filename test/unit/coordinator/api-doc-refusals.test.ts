import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { CONTROLLER_OP_NAMES, CONTROLLER_OP_REFUSALS, ERROR_CATALOG, EVERY_OP_REFUSALS, PARTICIPANT_REFUSALS, type ParticipantRefusals } from "../../../protocol/index.js";

/**
 * docs/api.md lists, per controller op, the refusals a controller author codes against. A code
 * there that the catalog lacks (a typo, a renamed code) would have them handle something the
 * coordinator never answers; an op without a list, or a code listed without saying when, leaves
 * them guessing. Each list names exactly the codes of CONTROLLER_OP_REFUSALS
 * (protocol/controller-refusals.ts), which the OpenAPI document is generated from, so the docs, the
 * document and the code cannot drift; what each op can answer is traced by hand into that table.
 */
const doc = readFileSync(new URL("../../../docs/api.md", import.meta.url), "utf8");
const operations = doc.slice(doc.indexOf("## Operations"), doc.indexOf("## 1. TypeScript client library"));

/** The text of `### \`op\`` up to the next heading. */
function section(op: string): string {
  const start = operations.indexOf(`### \`${op}\`\n`);
  if (start < 0) return "";
  const next = operations.indexOf("\n#", start + 1);
  return operations.slice(start, next < 0 ? undefined : next);
}

/** The bullets of the first list after `marker` in `text` (none when a paragraph ends it first). */
function bulletsAfter(text: string, marker: string): string[] {
  const start = text.indexOf(marker);
  if (start < 0) return [];
  const paragraphs = text.slice(start).split("\n\n");
  // The marker's paragraph (the rest of its sentence), then the list, if any, right after it.
  const list = paragraphs[1] ?? "";
  return list.startsWith("* ") ? list.split("\n").filter((line) => line.startsWith("* ")) : [];
}

/** The family of participants' refusals a bullet names instead of a code (see CONTROLLER_OP_REFUSALS). */
function participantFamily(bullet: string): ParticipantRefusals | undefined {
  if (/^\* (the participants' codes|commit failures)/.test(bullet)) return "combined";
  if (/^\* a participant's refusal/.test(bullet)) return "restore";
  return undefined;
}

/** The codes a bullet leads with (`a`, `a`/`b`, `a` or `b`), before what it says about them. */
function leadingCodes(bullet: string): string[] {
  const lead = /^\* ((?:`[^`]+`(?:\/|, | or |,? )?)+)/.exec(bullet);
  if (!lead) return [];
  return [...lead[1]!.matchAll(/`([^`]+)`/g)].map((m) => m[1]!);
}

describe("docs/api.md refusal lists", () => {
  it("has a Refusals list for every controller op, each code from the catalog with when it happens", () => {
    for (const op of CONTROLLER_OP_NAMES) {
      const text = section(op);
      expect(text, `### \`${op}\``).not.toBe("");
      expect(text, `${op} has a Refusals line`).toMatch(/^Refusals:/m);
      const listed = new Set<string>();
      const families = new Set<ParticipantRefusals>();
      for (const bullet of bulletsAfter(text, "\nRefusals:")) {
        const codes = leadingCodes(bullet);
        // "the participants' codes", "commit failures" and "a participant's refusal" name a family, defined in the op list's preamble.
        if (codes.length === 0) {
          const family = participantFamily(bullet);
          expect([op, bullet.slice(0, 80), family]).toEqual([op, bullet.slice(0, 80), expect.any(String)]);
          families.add(family!);
          continue;
        }
        for (const code of codes) expect(Object.keys(ERROR_CATALOG), `${op}: ${bullet.slice(0, 80)}`).toContain(code);
        expect(bullet, `${op}: \`${codes.join("/")}\` says when`).toMatch(/\(/);
        for (const code of codes) listed.add(code);
      }
      // Exactly the table's: a code the docs add or drop is one the OpenAPI document would not say.
      const table = CONTROLLER_OP_REFUSALS[op];
      expect([op, [...listed].sort()]).toEqual([op, [...table.codes].sort()]);
      expect([op, [...families]]).toEqual([op, table.participants ? [table.participants] : []]);
    }
  });

  it("lists the refusals every op can answer, each from the catalog", () => {
    const bullets = bulletsAfter(operations, "**Refusals every op can answer.**");
    expect(bullets.length).toBeGreaterThan(0);
    const codes = bullets.flatMap(leadingCodes);
    for (const code of codes) expect(Object.keys(ERROR_CATALOG)).toContain(code);
    // The transport and gate codes a controller gets from any op, whatever its own list says: the table's.
    expect([...codes].sort()).toEqual([...EVERY_OP_REFUSALS].sort());
  });

  it("names in its definition of the participants' codes only codes of PARTICIPANT_REFUSALS (not_leader is answered as outcome_unknown)", () => {
    const from = operations.indexOf(`"The participants' codes" below is`);
    expect(from).toBeGreaterThan(0);
    const paragraph = operations.slice(from, operations.indexOf("\n\n", from));
    const named = [...paragraph.matchAll(/`([a-z_]+)`/g)].map((m) => m[1]!).filter((name) => name in ERROR_CATALOG && name !== "not_leader");
    expect(named.length).toBeGreaterThan(3);
    for (const code of named) expect(PARTICIPANT_REFUSALS as readonly string[]).toContain(code);
  });

  it("states the HTTP status of every code a controller op's lists name, as the catalog has it", () => {
    const from = doc.indexOf("The HTTP status of a refusal is");
    const sentence = doc.slice(from, doc.indexOf(")", doc.indexOf("the catalog's (", from))).replace(/\n/g, " ");
    const stated = new Map<string, number>();
    for (const [, group, status] of sentence.matchAll(/((?:`[a-z_*]+`(?:\/ ?)?)+) (\d{3})/g)) {
      for (const [, name] of group!.matchAll(/`([a-z_*]+)`/g)) {
        const codes = name!.endsWith("*") ? Object.keys(ERROR_CATALOG).filter((c) => c.startsWith(name!.slice(0, -1))) : [name!];
        for (const code of codes) stated.set(code, Number(status));
      }
    }
    const listed = new Set([...CONTROLLER_OP_NAMES.flatMap((op) => bulletsAfter(section(op), "\nRefusals:")), ...bulletsAfter(operations, "**Refusals every op can answer.**")].flatMap(leadingCodes));
    listed.delete("reply_too_large"); // the NATS API's alone: stated apart
    for (const code of listed) expect([code, stated.get(code)]).toEqual([code, ERROR_CATALOG[code as keyof typeof ERROR_CATALOG].status]);
  });
});
