/**
 * An upstream answer's `Location`, as its caller is to follow it. The proxy sends the upstream its own
 * Host, so a redirect the upstream builds from it names the upstream's origin: Starlette's router (vLLM's
 * and SGLang's servers are FastAPI apps) answers `POST /v1/chat/completions/` with `307` to
 * `http://<upstream host>/v1/chat/completions`, and openai-python follows redirects, method and body
 * kept. Passed on as sent, it sent the caller straight to the upstream, past the proxy: a generation
 * call untracked, and run while a checkpoint holds admission closed. So a location on the upstream's
 * origin under its base path (absolute, scheme-relative or a path) becomes the same route on the proxy,
 * behind the caller's `/ng-rollout/<capture_key>` prefix, as a path its client resolves against the
 * proxy's URL. Any other location (another origin, outside the base path, a relative path, which
 * resolves on the proxy as it would upstream) is left as sent.
 *
 * `upstream` is the upstream's origin and base path (what the proxy puts before a route); `prefix` the
 * caller's rollout prefix, or "".
 */
export function proxiedLocation(location: string, upstream: URL, prefix: string): string {
  if (!/^([A-Za-z][A-Za-z0-9+.-]*:|\/)/.test(location)) return location;
  let target: URL;
  try {
    target = new URL(location, upstream.origin);
  } catch {
    return location;
  }
  if (target.origin !== upstream.origin) return location;
  const base = upstream.pathname.replace(/\/+$/, "");
  if (target.pathname !== base && !target.pathname.startsWith(`${base}/`)) return location;
  return `${prefix}${target.pathname.slice(base.length) || "/"}${target.search}${target.hash}`;
}
