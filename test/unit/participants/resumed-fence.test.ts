import { describe, expect, it } from "vitest";
import { ResumedFence } from "../../../participants/control-plane/resumed-fence.js";

// The control plane refuses a delayed call for one of the last N resumed checkpoints with
// stale_checkpoint. These pin the two halves of "the last N": exactly N are kept, and "last" is by
// the latest add (an id resumed again is the newest, not the oldest it was first).
describe("the resumed fence", () => {
  it("keeps exactly `capacity` ids: the capacity-th newest is still fenced, the one before it is not", () => {
    const fence = new ResumedFence(3);
    for (const id of ["a", "b", "c"]) fence.add(id);
    // Pins the bound: at capacity nothing is dropped yet (a `>=` bound kept only 2).
    expect(["a", "b", "c"].map((id) => fence.has(id))).toEqual([true, true, true]);
    fence.add("d");
    expect(["a", "b", "c", "d"].map((id) => fence.has(id))).toEqual([false, true, true, true]);
  });

  it("an id added again becomes the newest: the oldest other id is dropped first", () => {
    const fence = new ResumedFence(3);
    for (const id of ["a", "b", "c"]) fence.add(id);
    fence.add("a"); // a resumed again (e.g. an abort after the resume): it must outlive b and c
    fence.add("d");
    expect(["a", "b", "c", "d"].map((id) => fence.has(id))).toEqual([true, false, true, true]);
  });
});
