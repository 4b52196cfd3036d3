import { describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { EpisodeSteps, type StepEpisode } from "../../../participants/kinds/environment/index.js";
import { ep } from "../../support/episode.js";
import { expectRetryAfter } from "../../support/park-retry.js";

const flush = () => new Promise((resolve) => setImmediate(resolve));

/** A latch a test opens when it wants a step to finish. */
function latch() {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

describe("episode steps", () => {
  it("a wait step blocks; its boundary is recorded after it and the episode parks there", async () => {
    const steps = new EpisodeSteps();
    const verify = latch();
    const run = steps.run(ep("w1"), { data: undefined }, async (e) => {
      await e.boundary({ next: "verify" });
      const reward = await e.step("wait", async () => {
        await verify.promise;
        return 1;
      });
      await e.boundary({ next: "return", reward });
      return reward;
    });
    await flush();
    steps.close();
    expect(steps.blockers()).toEqual(["w1"]);
    expect(steps.exportable()).toEqual([]);
    verify.open();
    await flush();
    expect(steps.blockers()).toEqual([]);
    expect(steps.states().parked).toBe(1);
    expect(steps.exportable()).toEqual([{ id: ep("w1"), boundary: { next: "return", reward: 1 }, data: undefined }]);
    steps.open();
    expect(await run).toBe(1);
    expect(steps.size).toBe(0);
  });

  it("a replay step does not block; it is exported at the boundary before it and parks at the next one", async () => {
    const steps = new EpisodeSteps();
    const agent = latch();
    const run = steps.run(ep("r1"), { data: undefined }, async (e) => {
      await e.boundary({ next: "invoke_agent" });
      const answer = await e.step("replay", async () => {
        await agent.promise;
        return "42";
      });
      await e.boundary({ next: "verify", answer });
      return answer;
    });
    await flush();
    steps.close();
    expect(steps.blockers()).toEqual([]);
    expect(steps.exportable().map((x) => x.boundary)).toEqual([{ next: "invoke_agent" }]);
    agent.open();
    await flush();
    expect(steps.states()).toMatchObject({ parked: 1, replay_step: 0 });
    expect(steps.exportable().map((x) => x.boundary)).toEqual([{ next: "verify", answer: "42" }]);
    steps.open();
    expect(await run).toBe("42");
  });

  it("a restored episode inside its first replay step is exported at the boundary it was restored from until the step records the next one", async () => {
    const steps = new EpisodeSteps();
    const verify = latch();
    let started = 0;
    const episode = (e: StepEpisode) => async () => {
      const from = e.continuation();
      expect(from).toEqual({ next: "verify", answer: "42" });
      const reward = await e.step("replay", async () => {
        started += 1;
        await verify.promise;
        return 1;
      });
      await e.boundary({ next: "return", reward });
      return reward;
    };
    const run = steps.run(ep("v1", 1), { data: undefined, restoredBoundary: { next: "verify", answer: "42" } }, (e) => episode(e)());
    await flush();
    steps.close();
    // In flight at prepare: not a blocker, exported where it was restored (the step runs again from there).
    expect(steps.blockers()).toEqual([]);
    expect(steps.exportable()).toEqual([{ id: ep("v1", 1), boundary: { next: "verify", answer: "42" }, data: undefined }]);
    verify.open();
    await flush();
    // The step finished while the checkpoint is open: it parks at the boundary after it, never runs twice here.
    expect(steps.exportable()).toEqual([{ id: ep("v1", 1), boundary: { next: "return", reward: 1 }, data: undefined }]);
    steps.open();
    expect(await run).toBe(1);
    expect(started).toBe(1);
  });

  it("an episode without a boundary inside its first replay step is exported with boundary null", async () => {
    const steps = new EpisodeSteps();
    const seed = latch();
    const run = steps.run(ep("n1"), { data: undefined }, async (e) => e.step("replay", () => seed.promise));
    await flush();
    steps.close();
    expect(steps.exportable()).toEqual([{ id: ep("n1"), boundary: null, data: undefined }]);
    seed.open();
    steps.open();
    await run;
  });

  it("a step never starts while a checkpoint is open: the episode parks at its latest boundary", async () => {
    const steps = new EpisodeSteps();
    const started: string[] = [];
    steps.close();
    const run = steps.run(ep("p1"), { data: undefined, restoredBoundary: { next: "verify" } }, async (e) => {
      expect(e.continuation()).toEqual({ next: "verify" });
      expect(e.continuation()).toBeNull();
      await e.step("wait", async () => started.push("verify"));
      return "done";
    });
    await flush();
    expect(started).toEqual([]);
    expect(steps.states().parked).toBe(1);
    expect(steps.exportable().map((x) => x.boundary)).toEqual([{ next: "verify" }]);
    steps.open();
    expect(await run).toBe("done");
    expect(started).toEqual(["verify"]);
  });

  it("after a finished wait step the next step runs on instead of parking at the stale boundary (several tool calls in one turn)", async () => {
    const steps = new EpisodeSteps();
    const tool1 = latch();
    const ran: string[] = [];
    const run = steps.run(ep("t1"), { data: undefined }, async (e) => {
      await e.boundary({ next: "loop", turn: 0 });
      await e.step("wait", async () => {
        await tool1.promise;
        ran.push("tool1");
      });
      await e.step("wait", async () => void ran.push("tool2")); // no boundary in between
      await e.boundary({ next: "loop", turn: 1 });
      return "done";
    });
    await flush();
    steps.close(); // the checkpoint waits for tool 1
    expect(steps.blockers()).toEqual(["t1"]);
    tool1.open();
    await flush();
    // Parking at {turn: 0} would replay tool 1 after a crash: tool 2 runs, then it parks at turn 1.
    expect(ran).toEqual(["tool1", "tool2"]);
    expect(steps.blockers()).toEqual([]);
    expect(steps.exportable().map((x) => x.boundary)).toEqual([{ next: "loop", turn: 1 }]);
    steps.open();
    expect(await run).toBe("done");
  });

  it("a replay step started after a finished wait step (no boundary between) blocks: its boundary is stale", async () => {
    const steps = new EpisodeSteps();
    const agent = latch();
    const run = steps.run(ep("t2"), { data: undefined }, async (e) => {
      await e.boundary({ next: "loop", turn: 0 });
      await e.step("wait", async () => undefined);
      const answer = await e.step("replay", async () => {
        await agent.promise;
        return "42";
      });
      await e.boundary({ next: "loop", turn: 1, answer });
      return answer;
    });
    await flush();
    steps.close();
    // Exporting {turn: 0} would replay the finished wait step after a crash.
    expect(steps.blockers()).toEqual(["t2"]);
    expect(steps.exportable()).toEqual([]);
    agent.open();
    await flush();
    expect(steps.exportable().map((x) => x.boundary)).toEqual([{ next: "loop", turn: 1, answer: "42" }]);
    steps.open();
    expect(await run).toBe("42");
  });

  it("an episode whose step failed is neither exported nor counted parked while it ends", async () => {
    const steps = new EpisodeSteps();
    const cleanup = latch();
    const run = steps.run(ep("f1"), { data: undefined }, async (e) => {
      await e.boundary({ next: "invoke_agent" });
      try {
        await e.step("replay", async () => {
          throw new Error("the agent failed");
        });
      } catch (error) {
        await cleanup.promise; // e.g. closing its session over the network
        throw error;
      }
    });
    await flush();
    steps.close();
    expect(steps.exportable()).toEqual([]);
    expect(steps.blockers()).toEqual(["f1"]);
    cleanup.open();
    await expect(run).rejects.toThrow("the agent failed");
    steps.open();
  });

  it("a new checkpoint closing before a parked episode wakes keeps it parked", async () => {
    const steps = new EpisodeSteps();
    const run = steps.run(ep("k1"), { data: undefined }, async (e) => {
      await e.boundary({ next: "a" });
      await e.boundary({ next: "b" });
      return "ok";
    });
    steps.close();
    await flush();
    steps.open();
    steps.close();
    await flush();
    expect(steps.states().parked).toBe(1);
    steps.open();
    expect(await run).toBe("ok");
  });

  it("parked time does not count against the episode deadline", async () => {
    const clock = new ManualClock(1_000_000);
    const steps = new EpisodeSteps(undefined, clock);
    const work = latch();
    const run = steps.run(ep("d1"), { data: undefined, timeoutMs: 1000 }, async (e) => {
      await e.step("replay", (signal) => Promise.race([work.promise, new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)))]));
      return "ok";
    });
    clock.advance(600);
    steps.close();
    clock.advance(10_000); // a long checkpoint
    expect(steps.remainingMs(ep("d1"))).toBe(400);
    steps.open();
    clock.advance(300);
    expect(steps.remainingMs(ep("d1"))).toBe(100);
    work.open();
    expect(await run).toBe("ok");

    const late = steps.run(ep("d2"), { data: undefined, timeoutMs: 50 }, (e) => new Promise((_, reject) => e.signal.addEventListener("abort", () => reject(e.signal.reason))));
    clock.advance(51);
    await expect(late).rejects.toMatchObject({ code: "deadline_exceeded" });
  });

  it("an episode's time budget is a duration: a wall-clock step forward or back neither ends nor stretches it", async () => {
    const clock = new ManualClock(1_000_000);
    const steps = new EpisodeSteps(undefined, clock);
    const work = latch();
    const run = steps.run(ep("j1"), { data: undefined, timeoutMs: 1000 }, async (e) => {
      await e.step("replay", (signal) => Promise.race([work.promise, new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)))]));
      return "ok";
    });
    clock.advance(100);
    clock.stepWall(3_600_000); // NTP steps the wall clock an hour forward mid-episode
    expect(steps.remainingMs(ep("j1"))).toBe(900);
    steps.close(); // a checkpoint suspends the countdown
    clock.stepWall(-7_200_000); // and back two hours while it is parked
    steps.open();
    expect(steps.remainingMs(ep("j1"))).toBe(900);
    clock.advance(899);
    work.open();
    expect(await run).toBe("ok");

    const late = steps.run(ep("j2"), { data: undefined, timeoutMs: 50 }, (e) => new Promise((_, reject) => e.signal.addEventListener("abort", () => reject(e.signal.reason))));
    clock.stepWall(-3_600_000); // a step back does not hold its time limit off for an hour
    clock.advance(51);
    await expect(late).rejects.toMatchObject({ code: "deadline_exceeded" });
  });

  it("retire stops parked episodes and waits for them; final clean-up is not interrupted", async () => {
    const steps = new EpisodeSteps();
    const cleanup = latch();
    const cleaned: string[] = [];
    const parked = steps.run(ep("x", 0), { data: undefined }, async (e) => {
      await e.boundary({ next: "verify" });
      await e.boundary({ next: "return" });
      return "never";
    });
    const parkedOutcome = parked.catch((error: unknown) => error);
    const finishing = steps.run(ep("y", 1), { data: undefined }, async (e) => {
      await e.finishing(async () => {
        await cleanup.promise;
        // Not interrupted: clean-up that observes the episode's signal still sees it unaborted.
        cleaned.push(`y:${e.signal.aborted ? "aborted" : "running"}`);
      });
      return "finished";
    });
    steps.close();
    await flush();
    expect(steps.states()).toMatchObject({ parked: 1, running: 1 });
    const retired = steps.retire([ep("x", 0), ep("y", 3)]);
    expect(steps.blockers().sort()).toEqual(["x", "y-a1"]);
    await flush();
    expect(steps.blockers()).toEqual(["y-a1"]);
    expect(await parkedOutcome).toMatchObject({ code: "stale_attempt" });
    cleanup.open();
    await retired;
    expect(await finishing).toBe("finished");
    expect(cleaned).toEqual(["y:running"]);
    expect(steps.size).toBe(0);
  });

  it("a park after a finished wait step (no boundary since) waits as a blocker, never exported at the stale boundary", async () => {
    const steps = new EpisodeSteps();
    const tool = latch();
    const run = steps.run(ep("pw"), { data: undefined }, async (e) => {
      await e.boundary({ next: "tool" });
      await e.step("wait", () => tool.promise);
      await e.park(); // the next call was refused admission_closed by its callee
      await e.boundary({ next: "after" });
      return "done";
    });
    await flush();
    steps.close();
    tool.open();
    for (let i = 0; i < 10 && steps.states().wait_step > 0; i++) await flush();
    await flush();
    expect(steps.blockers()).toEqual(["pw"]);
    expect(steps.exportable()).toEqual([]);
    steps.open();
    expect(await run).toBe("done");
  });

  it("final clean-up right after a finished wait step (no boundary since) runs on while a checkpoint is open instead of blocking it until resume", async () => {
    const steps = new EpisodeSteps();
    const verify = latch();
    let outcome: string | undefined;
    const run = steps
      .run(ep("fw"), { data: undefined }, async (e) => {
        await e.boundary({ next: "verify" });
        const reward = await e.step("wait", async () => {
          await verify.promise;
          return 1;
        });
        await e.finishing(async () => undefined); // e.g. close the agent session; no {next:"return"} boundary
        return `reward ${reward}`;
      })
      .then((r) => (outcome = r));
    await flush();
    steps.close();
    expect(steps.blockers()).toEqual(["fw"]);
    verify.open();
    // It could not park at {next:"verify"} (that would run verify again): it ends, so the checkpoint can prepare.
    for (let i = 0; i < 20 && outcome === undefined; i++) await flush();
    expect(outcome).toBe("reward 1");
    expect(steps.blockers()).toEqual([]);
    steps.open();
    await run;
  });

  it("the episode deadline does not interrupt final clean-up either", async () => {
    const clock = new ManualClock(1_000_000);
    const steps = new EpisodeSteps(undefined, clock);
    const cleanup = latch();
    const run = steps.run(ep("z"), { data: undefined, timeoutMs: 100 }, async (e) =>
      e.finishing(async () => {
        await cleanup.promise;
        return e.signal.aborted ? "aborted" : "finished";
      }),
    );
    await flush();
    clock.advance(1000);
    cleanup.open();
    expect(await run).toBe("finished");
  });

  it("a retire during final clean-up stops the episode once the clean-up ends: no later step runs for the retired attempt", async () => {
    const steps = new EpisodeSteps();
    const cleanup = latch();
    const ran: string[] = [];
    const run = steps.run(ep("fr"), { data: undefined }, async (e) => {
      await e.finishing(() => cleanup.promise);
      // Code going on after its clean-up: a retired attempt must not run another step.
      await e.step("wait", async () => void ran.push("step after clean-up"));
      return "went on";
    });
    const outcome = run.catch((error: unknown) => error);
    await flush();
    const retired = steps.retire([ep("fr")]);
    cleanup.open();
    await retired;
    expect(ran).toEqual([]);
    expect(await outcome).toMatchObject({ code: "stale_attempt" });
  });

  it("an episode deadline that passes during final clean-up stops the episode once the clean-up ends", async () => {
    const clock = new ManualClock(1_000_000);
    const steps = new EpisodeSteps(undefined, clock);
    const cleanup = latch();
    const ran: string[] = [];
    const run = steps.run(ep("fd"), { data: undefined, timeoutMs: 100 }, async (e) => {
      await e.finishing(() => cleanup.promise);
      await e.step("wait", async () => void ran.push("step after clean-up"));
      return "went on";
    });
    const outcome = run.catch((error: unknown) => error);
    await flush();
    clock.advance(1000);
    cleanup.open();
    expect(await outcome).toMatchObject({ code: "deadline_exceeded" });
    expect(ran).toEqual([]);
  });

  it("a duplicate start of a tracked attempt is refused", async () => {
    const steps = new EpisodeSteps();
    const hold = latch();
    const first = steps.run(ep("dup"), { data: undefined }, () => hold.promise);
    expect(() => steps.run(ep("dup"), { data: undefined }, async () => undefined)).toThrow(CheckpointError);
    hold.open();
    await first;
  });

  it("a park while admission is open retries on the injected clock", async () => {
    const clock = new ManualClock(1_000_000);
    const steps = new EpisodeSteps(undefined, clock);
    let resumed = false;
    const run = steps.run(ep("pk"), { data: undefined }, async (e) => {
      await e.boundary({ next: "call" });
      await e.park(); // a callee refused with admission_closed; ours is still open
      resumed = true;
    });
    for (let i = 0; i < 10 && steps.states().parked === 0; i++) await flush();
    expect(steps.states().parked).toBe(1);
    await expectRetryAfter(clock, 100, () => resumed);
    await run;
  });

  it("markRestart waits for reopen; restarts never block and are never exported", async () => {
    const steps = new EpisodeSteps();
    let episode!: StepEpisode;
    const hold = latch();
    const run = steps.run(ep("rs"), { data: undefined }, async (e) => {
      episode = e;
      await e.markRestart();
      await hold.promise;
    });
    await flush();
    expect(steps.restarts()).toEqual(["rs"]);
    expect(episode.key).toBe("rs");
    steps.close();
    expect(steps.blockers()).toEqual([]);
    expect(steps.exportable()).toEqual([]);
    steps.open();
    hold.open();
    await run;
  });

  it("markRestart called while a checkpoint is open takes effect only after reopen: the restart set never changes during a checkpoint", async () => {
    const steps = new EpisodeSteps();
    const callee = latch();
    let marked = false;
    const hold = latch();
    const run = steps.run(ep("rc"), { data: undefined }, async (e) => {
      await e.boundary({ next: "seed" });
      const restart = await e.step("replay", async () => {
        await callee.promise;
        return true;
      });
      if (restart) await e.markRestart();
      marked = true;
      await hold.promise;
    });
    await flush();
    steps.close();
    expect(steps.exportable().map((x) => x.id)).toEqual([ep("rc")]);
    // The callee answers "restart" while the checkpoint is open: the episode stays what prepare saw.
    callee.open();
    await flush();
    expect(marked).toBe(false);
    expect(steps.restarts()).toEqual([]);
    expect(steps.exportable().map((x) => x.id)).toEqual([ep("rc")]);
    steps.open();
    await flush();
    expect(marked).toBe(true);
    expect(steps.restarts()).toEqual(["rc"]);
    hold.open();
    await run;
  });

  it.each([
    ["running past its boundary", "running"],
    ["inside a wait step", "wait"],
    ["right after a finished wait step", "after-wait"],
  ])("markRestart while a checkpoint is open from a point that blocks it (%s) is refused invalid_phase, changing nothing, instead of holding the prepare to its deadline", async (_why, where) => {
    const steps = new EpisodeSteps();
    const reached = latch();
    const go = latch();
    let outcome: unknown = "pending";
    const mark = (e: StepEpisode) =>
      e.markRestart().then(
        () => (outcome = "marked"),
        (error: unknown) => (outcome = error),
      );
    const run = steps.run(ep("rb"), { data: undefined }, async (e) => {
      await e.boundary({ next: "call" });
      if (where === "wait") {
        await e.step("wait", async () => {
          reached.open();
          await go.promise;
          await mark(e);
        });
      } else {
        if (where === "after-wait") await e.step("wait", async () => undefined);
        reached.open();
        await go.promise;
        await mark(e);
      }
      await e.boundary({ next: "after" });
    });
    await reached.promise;
    steps.close();
    expect(steps.blockers()).toEqual(["rb"]);
    go.open();
    for (let i = 0; i < 10 && outcome === "pending"; i++) await flush();
    expect(outcome).toBeInstanceOf(CheckpointError);
    expect((outcome as CheckpointError).code).toBe("invalid_phase");
    // Nothing changed: still the blocker prepare saw, no restart; it runs on to its next boundary and parks there.
    expect(steps.restarts()).toEqual([]);
    for (let i = 0; i < 10 && steps.states().parked === 0; i++) await flush();
    expect(steps.blockers()).toEqual([]);
    expect(steps.exportable().map((x) => x.boundary)).toEqual([{ next: "after" }]);
    steps.open();
    await run;
  });

  it("timed bounds a clean-up call by time outside checkpoints only, whatever the episode's own signal", async () => {
    const clock = new ManualClock();
    const steps = new EpisodeSteps(undefined, clock);
    let signal!: AbortSignal;
    const started = latch();
    const run = steps.run(ep("tc"), { data: undefined, timeoutMs: 10 }, async (e) => {
      await e.boundary({ next: "call" });
      return e.timed(50, (s) => {
        signal = s;
        started.open();
        return new Promise((_, reject) => s.addEventListener("abort", () => reject(s.reason)));
      });
    });
    const outcome = run.catch((error: unknown) => error);
    await Promise.race([started.promise, outcome]);
    clock.advance(30); // the episode's own deadline (10 ms) passes: the clean-up call goes on
    expect(signal.aborted).toBe(false);
    steps.close();
    await flush();
    clock.advance(10_000); // a long checkpoint does not count
    expect(signal.aborted).toBe(false);
    steps.open();
    await flush();
    clock.advance(19);
    await flush();
    expect(signal.aborted).toBe(false);
    clock.advance(1);
    await flush();
    expect(signal.aborted).toBe(true);
    expect(await outcome).toMatchObject({ code: "deadline_exceeded" });
  });
});

