import { expect, it } from "vitest";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { deferred } from "../../support/deferred.js";

/**
 * A retire naming both a native session and a legacy `/run` episode stops both at once: an
 * activation that ignores its abort signal (a user's agent, a long generation) must not hold off
 * aborting the legacy episode, whose turn loop would otherwise go on calling the model and the
 * resources for the retired attempt until the activation ended (or past the retire's deadline).
 */

const flush = async () => {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
};

it("a retire aborts the legacy /run episodes while a native activation of the same retire still ignores its signal", async () => {
  const frees: string[] = [];
  const kind = new AgentKind(
    {
      exportAgentSessions: async (keys) => Object.fromEntries(keys.map((key) => [key, null])),
      restoreAgentSessions: async () => undefined,
      retireAgentSession: async (key) => void frees.push(key),
    },
    new ManualClock(1_700_000_000_000),
  );
  const native = { rollout_id: "n1", attempt: 0 };
  const legacy = { rollout_id: "l1", attempt: 0 };
  const nativeLoop = deferred(); // ignores its abort signal until the test lets it end
  kind.openSession(native);
  const activation = kind.activate(native, () => nativeLoop.promise);
  let legacySignal: AbortSignal | undefined;
  const run = kind
    .runLegacy(legacy, { task: 1 }, {}, (episode) => {
      legacySignal = episode.signal;
      return new Promise<void>((resolve) => episode.signal.addEventListener("abort", () => resolve(), { once: true }));
    })
    .then(
      () => "ended",
      () => "ended",
    );
  await flush();
  expect(legacySignal?.aborted).toBe(false);

  let retired = false;
  const retire = kind.retire([native, legacy]).then(() => void (retired = true));
  await flush();
  // The activation still runs, yet the legacy episode was aborted and has ended.
  expect({ legacyAborted: legacySignal?.aborted, retired }).toEqual({ legacyAborted: true, retired: false });
  expect(await run).toBe("ended");

  nativeLoop.resolve();
  await activation;
  await retire;
  expect({ frees, live: kind.hasLiveState() }).toEqual({ frees: ["n1"], live: false });
});
