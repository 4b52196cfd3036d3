/**
 * A CommonJS package's exports, from its dynamic `import()` however that ran: Node gives its named
 * exports beside `default` (module.exports); a chunk of the build's bundles (deploy/bundle-entries.mjs,
 * esbuild's code splitting) gives `default` alone. For CommonJS packages only: an ES module's
 * `default` is one of its exports, not all of them.
 */
export async function commonJsExports<T>(loading: Promise<T>): Promise<T> {
  const namespace = await loading;
  return ((namespace as { default?: T }).default ?? namespace) as T;
}
