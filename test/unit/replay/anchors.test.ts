import { createHash } from "node:crypto";
import { describe, expect, it, vi } from "vitest";
import {
  compactionSeeds,
  DEFAULT_RECHECK_PROMPT,
  estimateTokens,
  isResumePoint,
  recheckSeed,
  ReplayError,
  seededContextNodes,
  seededRandom,
  toolCallSeeds,
  type Message,
  type TraceRecord,
} from "../../../participants/replay/index.js";
import { call, compactedTrace, linearTrace, RESTART, result, say, sys, TASK_PROMPT, TraceBuilder, user } from "./fixtures.js";

const ID = "0123abcd" + "f".repeat(24);

function threeToolTrace(id = ID): TraceRecord {
  const b = new TraceBuilder();
  b.chain(null, [
    [sys()],
    [user(TASK_PROMPT)],
    [call("a"), true],
    [result("a")],
    [call("b"), true],
    [result("b")],
    [call("c"), true],
    [result("c")],
    [say("42"), true],
  ]);
  return b.trace(id);
}

const roles = (prompt: string | Message[]) => (typeof prompt === "string" ? ["string"] : prompt.map((m) => m.role));

describe("continue / compaction", () => {
  it("(1) recovers the restart prompt of the rlm shape", () => {
    const seeds = compactionSeeds(compactedTrace(ID));
    expect(seeds).toHaveLength(1);
    expect(seeds[0]!.prompt).toBe(RESTART);
    expect(seeds[0]!.name).toBe("continue:0123abcd:compaction0");
    expect(seeds[0]!.tokens).toBeGreaterThan(0);
    expect(seeds[0]!.anchorNode).toBe(6);
    expect(seeds[0]!.anchor).toBe("compaction");
  });

  it("(2) a linear trace yields no compaction seeds", () => {
    expect(compactionSeeds(linearTrace(ID))).toEqual([]);
  });

  it("(3) any restart shape: keeping the task message and adding notes gives a Messages seed", () => {
    const b = new TraceBuilder();
    const root = b.add(null, sys());
    const task = b.add(root, user(TASK_PROMPT));
    b.chain(task, [[call("c1"), true], [result("c1")], [say("Handoff summary."), true]]);
    b.chain(task, [[user("Notes: python says 42.")], [say("42"), true]]);
    const seeds = compactionSeeds(b.trace(ID));
    expect(seeds).toHaveLength(1);
    expect(seeds[0]!.prompt).toEqual([user(TASK_PROMPT), user("Notes: python says 42.")]);
    expect(seeds[0]!.name).toBe("continue:0123abcd:compaction0");
  });

  it("(4) ignores a retokenization fork whose context carries an assistant copy", () => {
    const b = new TraceBuilder();
    const root = b.add(null, sys());
    const task = b.add(root, user(TASK_PROMPT));
    b.chain(task, [[say("Let me think."), true], [user("go on")], [say("42"), true]]);
    b.chain(task, [[say("Let me think.")], [user("go on")], [say("42!"), true]]);
    expect(compactionSeeds(b.trace(ID))).toEqual([]);
  });

  it("(14) skips the task's own launch context when an auxiliary branch sorts first", () => {
    for (const taskPrompt of [TASK_PROMPT, [user(TASK_PROMPT)]]) {
      const b = new TraceBuilder();
      const root = b.add(null, sys());
      b.chain(root, [[user("auxiliary: list files")], [say("a.txt"), true]]);
      b.chain(root, [[user(TASK_PROMPT)], [say("42"), true]]);
      expect(compactionSeeds(b.trace(ID, { prompt: taskPrompt }))).toEqual([]);
    }
    // The same trace with a genuine restart after the main branch still seeds that restart only.
    const b = new TraceBuilder();
    const root = b.add(null, sys());
    b.chain(root, [[user("auxiliary: list files")], [say("a.txt"), true]]);
    b.chain(root, [[user(TASK_PROMPT)], [say("summary"), true]]);
    b.chain(root, [[user(RESTART)], [say("42"), true]]);
    const seeds = compactionSeeds(b.trace(ID));
    expect(seeds.map((s) => [s.prompt, s.name])).toEqual([[RESTART, "continue:0123abcd:compaction0"]]);
  });

  it("a branch that shares no node with the others (a subagent or separate conversation) is no restart", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [say("42"), true]]);
    // Its own root: a subagent launched from system and user messages only, which would otherwise pass every other check.
    b.chain(null, [[sys()], [user("Subagent: verify 6*7.")], [say("42"), true]]);
    b.chain(null, [[user("Separate conversation: list files.")], [say("a.txt"), true]]);
    const trace = b.trace(ID);
    expect(compactionSeeds(trace)).toEqual([]);
    // Re-rooting the subagent at the shared system node makes it a restart.
    const shared = new TraceBuilder();
    const root = shared.add(null, sys());
    shared.chain(root, [[user(TASK_PROMPT)], [say("42"), true]]);
    shared.chain(root, [[user("Subagent: verify 6*7.")], [say("42"), true]]);
    expect(compactionSeeds(shared.trace(ID)).map((s) => s.prompt)).toEqual(["Subagent: verify 6*7."]);
  });
});

describe("continue / tool-call", () => {
  it("(6) resumes right after a complete tool-result run", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [call("x", "y"), true], [result("y")], [result("x")], [say("42"), true]]);
    const seeds = toolCallSeeds(b.trace(ID), { maxAnchors: null, seed: 0 });
    expect(seeds).toHaveLength(1);
    const prompt = seeds[0]!.prompt as Message[];
    expect(prompt[0]!.role).toBe("user"); // system stripped
    expect(prompt.at(-1)!.role).toBe("tool");
    const issuer = prompt.at(-3)!;
    expect(issuer.role === "assistant" && issuer.tool_calls!.map((c) => c.id).sort()).toEqual(["x", "y"]);
    expect(seeds[0]!.name).toBe("continue:0123abcd:tool-call4");
    expect(seeds[0]!.anchorNode).toBe(4);
  });

  it("(7) max_anchors=null seeds every boundary", () => {
    const seeds = toolCallSeeds(threeToolTrace(), { maxAnchors: null, seed: 0 });
    expect(seeds.map((s) => (s.prompt as Message[]).length)).toEqual([3, 5, 7]);
    expect(seeds.map((s) => s.name)).toEqual([
      "continue:0123abcd:tool-call3",
      "continue:0123abcd:tool-call5",
      "continue:0123abcd:tool-call7",
    ]);
    for (const s of seeds) expect((s.prompt as Message[]).at(-1)!.role).toBe("tool");
    // Recorded token prefix sums through the anchor grow along the trajectory.
    expect(seeds[0]!.tokens).toBeLessThan(seeds[1]!.tokens);
  });

  it("(8) a subset draw is deterministic per (seed, trace id) and keeps trajectory order", () => {
    const trace = threeToolTrace();
    const first = toolCallSeeds(trace, { maxAnchors: 2, seed: 7 }).map((s) => s.name);
    const again = toolCallSeeds(structuredClone(trace), { maxAnchors: 2, seed: 7 }).map((s) => s.name);
    expect(first).toHaveLength(2);
    expect(again).toEqual(first);
    const ends = first.map((n) => Number(/tool-call(\d+)/.exec(n)![1]));
    expect(ends).toEqual([...ends].sort((a, b) => a - b));
    // Different salts reach different subsets: the seed really keys the draw.
    const subsets = new Set(Array.from({ length: 20 }, (_, s) => toolCallSeeds(trace, { maxAnchors: 2, seed: s }).map((x) => x.name).join()));
    expect(subsets.size).toBeGreaterThan(1);
  });

  it("(8) the random source is injectable and keyed by '<seed>:<trace id>'", () => {
    const factory = vi.fn((_key: string) => () => 0.999);
    const seeds = toolCallSeeds(threeToolTrace(), { maxAnchors: 1, seed: 3, random: factory });
    expect(factory).toHaveBeenCalledWith(`3:${ID}`);
    expect(seeds.map((s) => s.name)).toEqual(["continue:0123abcd:tool-call7"]);
    expect(seededRandom("a")()).toBe(seededRandom("a")());
    expect(seededRandom("a")()).not.toBe(seededRandom("b")());
  });

  it("(9) a single draw comes from the full candidate set, named with ordinals across branches", () => {
    const trace = compactedTrace(ID);
    const all = toolCallSeeds(trace, { maxAnchors: null, seed: 0 }).map((s) => s.name);
    expect(all).toEqual(["continue:0123abcd:tool-call3", "continue:0123abcd:tool-call3-1"]);
    const drawn = new Set(Array.from({ length: 40 }, (_, s) => toolCallSeeds(trace, { maxAnchors: 1, seed: s })[0]!.name));
    expect([...drawn].sort()).toEqual(all);
  });

  it("a tool node shared by several branches is considered once", () => {
    // Two answers sampled after the same tool result: both branches pass through nodes 2-3.
    const b = new TraceBuilder();
    const tool = b.chain(null, [[sys()], [user(TASK_PROMPT)], [call("a"), true], [result("a")]]);
    b.add(tool, say("42"), true);
    b.add(tool, say("Forty-two"), true);
    const trace = b.trace(ID);
    const seeds = toolCallSeeds(trace, { maxAnchors: null, seed: 0 });
    expect(seeds.map((s) => [s.name, s.anchorNode])).toEqual([["continue:0123abcd:tool-call3", 3]]);
    // A draw of one keeps that seed on every salt: no duplicate candidate skews it.
    for (let s = 0; s < 10; s++) expect(toolCallSeeds(trace, { maxAnchors: 1, seed: s }).map((x) => x.name)).toEqual(["continue:0123abcd:tool-call3"]);
  });

  it("(10) skips partial tool runs", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [call("a", "b"), true], [result("a")], [say("42"), true]]);
    expect(toolCallSeeds(b.trace(ID), { maxAnchors: null, seed: 0 })).toEqual([]);
    const extra = new TraceBuilder();
    extra.chain(null, [[sys()], [user(TASK_PROMPT)], [call("a"), true], [result("a")], [result("z")], [say("42"), true]]);
    expect(toolCallSeeds(extra.trace(ID), { maxAnchors: null, seed: 0 })).toEqual([]);
  });

  it("offers no anchor after an earlier partial run: the seed would carry a call nobody answered", () => {
    // Call b is never answered; the later run of c is complete, but a prompt through it still
    // holds the dangling call, which a chat API refuses and a resume point never has.
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [call("a", "b"), true], [result("a")], [call("c"), true], [result("c")], [say("42"), true]]);
    const seeds = toolCallSeeds(b.trace(ID), { maxAnchors: null, seed: 0 });
    for (const seed of seeds) expect(isResumePoint(seed.prompt as Message[])).toBe(true);
    expect(seeds).toEqual([]);
    // A tool result with no issuer before its run makes every later prefix malformed too.
    const orphan = new TraceBuilder();
    orphan.chain(null, [[sys()], [user(TASK_PROMPT)], [result("z")], [call("c"), true], [result("c")], [say("42"), true]]);
    expect(toolCallSeeds(orphan.trace(ID), { maxAnchors: null, seed: 0 })).toEqual([]);
    // Complete runs before the anchor keep it: the prefix is a resume point.
    expect(toolCallSeeds(threeToolTrace(), { maxAnchors: null, seed: 0 }).every((s) => isResumePoint(s.prompt as Message[]))).toBe(true);
  });
});

describe("recheck", () => {
  it("(11) appends the verification turn after the final branch", () => {
    const seed = recheckSeed(compactedTrace(ID), DEFAULT_RECHECK_PROMPT)!;
    const prompt = seed.prompt as Message[];
    expect(roles(prompt)).toEqual(["user", "assistant", "tool", "assistant", "user"]);
    expect(prompt[0]!.content).toBe(RESTART);
    expect(prompt.at(-1)!.content).toBe(DEFAULT_RECHECK_PROMPT);
    expect(prompt.at(-2)!.content).toBe("Final answer: 42");
    expect(seed.name).toBe("recheck:0123abcd");
    expect(seed.anchorNode).toBe(9);
  });

  it("(12) strips a trailing unanswered tool call and a trailing 'continue' user turn", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [say("It is 42."), true], [user("continue")], [call("late"), true]]);
    const seed = recheckSeed(b.trace(ID), "Check it.")!;
    expect(seed.prompt).toEqual([user(TASK_PROMPT), say("It is 42."), user("Check it.")]);
  });

  it("(13) yields nothing when a dangling run leaves no sampled answer before it", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [call("a", "b"), true], [result("a")], [say("42"), true]]);
    expect(recheckSeed(b.trace(ID), "Check it.")).toBeNull();
  });

  it("cuts before a tool result no turn issued, so the seed is always a resume point", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [say("Let me think."), true], [result("orphan")], [say("42"), true]]);
    const seed = recheckSeed(b.trace(ID), "Check it.")!;
    expect(seed.prompt).toEqual([user(TASK_PROMPT), say("Let me think."), user("Check it.")]);
    expect(isResumePoint(seed.prompt as Message[])).toBe(true);
  });

  it("counts recorded tokens of the kept nodes plus the prompt estimate", () => {
    const trace = linearTrace(ID);
    const seed = recheckSeed(trace, "x".repeat(40))!;
    expect(seed.tokens).toBe(estimateTokens(trace.nodes) + 10);
  });
});

describe("seed names", () => {
  const sha8 = (id: string) => createHash("sha256").update(id, "utf8").digest("hex").slice(0, 8);

  it("tag a non-hex trace id by its sha256 so ids sharing 8 chars do not collide", () => {
    const ids = ["rollout-1", "rollout-2"]; // both "rollout-" by their first 8 chars
    const names = ids.map((id) => [
      ...compactionSeeds(compactedTrace(id)).map((s) => s.name),
      ...toolCallSeeds(compactedTrace(id), { maxAnchors: null, seed: 0 }).map((s) => s.name),
      recheckSeed(compactedTrace(id), "Check.")!.name,
    ]);
    for (const [i, id] of ids.entries()) {
      const tag = sha8(id);
      expect(names[i]).toEqual([`continue:${tag}:compaction0`, `continue:${tag}:tool-call3`, `continue:${tag}:tool-call3-1`, `recheck:${tag}`]);
    }
    expect(new Set(names.flat()).size).toBe(8);
  });

  it("keep the first 8 chars of a uuid4-hex id; short or uppercase hex ids are hashed", () => {
    expect(recheckSeed(compactedTrace(ID), "c")!.name).toBe("recheck:0123abcd");
    expect(recheckSeed(compactedTrace("0123abcd"), "c")!.name).toBe(`recheck:${sha8("0123abcd")}`);
    expect(recheckSeed(compactedTrace(ID.toUpperCase()), "c")!.name).toBe(`recheck:${sha8(ID.toUpperCase())}`);
    for (const id of ["rollout-1", "x", ID.toUpperCase()]) expect(recheckSeed(compactedTrace(id), "c")!.name).toMatch(/^recheck:[0-9a-f]{8}$/);
  });
});

describe("snapshots", () => {
  it("(5) seeds carry the anchor node's snapshot ref", () => {
    const trace = compactedTrace(ID);
    trace.info = { snapshots: { "0": "snap-sys", "6": "snap-restart", "9": "snap-final" } };
    expect(compactionSeeds(trace).map((s) => s.snapshot)).toEqual(["snap-restart"]);
    expect(recheckSeed(trace, "Check.")!.snapshot).toBe("snap-final");
    expect(toolCallSeeds(trace, { maxAnchors: null, seed: 0 })).toEqual([]); // tool nodes have no refs
  });

  it("(15) snapshotted records offer only snapshotted anchors", () => {
    const trace = compactedTrace(ID);
    trace.info = { snapshots: { "0": "snap-sys" } };
    expect(compactionSeeds(trace)).toEqual([]);
    expect(toolCallSeeds(trace, { maxAnchors: null, seed: 0 })).toEqual([]);
    expect(recheckSeed(trace, "Check.")).toBeNull();
    // Without any refs the same trace does have anchors.
    expect(toolCallSeeds(compactedTrace(ID), { maxAnchors: null, seed: 0 })).toHaveLength(2);
  });

  it("rejects a malformed snapshot map loudly", () => {
    const trace = compactedTrace(ID);
    trace.info = { snapshots: { "99": "nowhere" } };
    expect(() => compactionSeeds(trace)).toThrow(ReplayError);
    trace.info = { snapshots: { "01": "leading-zero" } };
    expect(() => recheckSeed(trace, "c")).toThrow(/info.snapshots/);
  });
});

describe("token estimate and loss masking", () => {
  it("falls back to characters / 4 when a record has no token ids", () => {
    const trace = linearTrace(ID);
    for (const node of trace.nodes) node.token_ids = [];
    const chars = "You are a careful solver.".length + TASK_PROMPT.length + "The answer is 42.".length;
    expect(estimateTokens(trace.nodes)).toBe(Math.floor(chars / 4));
  });

  it("tool-call seeds of a record without token ids (Gym records) fall back to characters / 4", () => {
    const trace = threeToolTrace();
    for (const node of trace.nodes) node.token_ids = [];
    const seeds = toolCallSeeds(trace, { maxAnchors: null, seed: 0 });
    // Through the anchor, system node included: what max_seed_tokens compares against.
    expect(seeds.map((s) => s.tokens)).toEqual([3, 5, 7].map((end) => estimateTokens(trace.nodes.slice(0, end + 1))));
    expect(seeds.every((s) => s.tokens > 0)).toBe(true);
  });

  it("turns a seed into prompt nodes that are never sampled and carry no trainable tokens", () => {
    const seed = recheckSeed(compactedTrace(ID), "Check.")!;
    const nodes = seededContextNodes(seed.prompt);
    expect(nodes).toHaveLength(5);
    expect(nodes.map((n) => n.parent)).toEqual([null, 0, 1, 2, 3]);
    expect(nodes.every((n) => !n.sampled && !n.mask.includes(true) && n.logprobs.length === 0)).toBe(true);
    expect(seededContextNodes(RESTART)).toEqual([
      { parent: null, message: user(RESTART), sampled: false, token_ids: [], mask: [], logprobs: [] },
    ]);
  });
});
