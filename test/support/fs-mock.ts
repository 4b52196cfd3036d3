/**
 * What the `vi.mock("node:fs", …)` and `vi.mock("node:fs/promises", …)` factories of the unit tests
 * that fault or watch file calls share. A factory is hoisted above its file's imports, so it loads
 * this module itself: `const { withOverrides } = await import("../../support/fs-mock.js")`. Nothing
 * here imports a file system module at run time (types only): loaded from inside the mock's
 * factory, it must not import the module being mocked.
 */

/**
 * `real` (the module as `importOriginal` gives it) with `overrides` in place, among its named
 * exports and on its default export alike, so code importing either way meets them. An override
 * need only take the calls the code under test makes (a path as a string, say), not every overload.
 */
export function withOverrides<M extends object>(real: M, overrides: { [K in keyof M]?: unknown }): M {
  return { ...real, ...overrides, default: { ...real, ...overrides } };
}

/**
 * `handle` (a FileHandle, say) with `overrides` in place of some of its members (the calls the
 * code under test makes); its other methods are bound to it, as the real handle's internals need.
 */
export function handleWith<H extends object>(handle: H, overrides: { [K in keyof H]?: unknown }): H {
  return new Proxy(handle, {
    get(target, prop) {
      if (Object.hasOwn(overrides, prop)) return overrides[prop as keyof H];
      const value = Reflect.get(target, prop, target) as unknown;
      return typeof value === "function" ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}
