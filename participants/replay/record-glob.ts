import { promises as fs, type Dirent, type Stats } from "node:fs";
import path from "node:path";
import { invalidRequest } from "./errors.js";

/**
 * Minimal glob expansion for record patterns: `*`, `?`, `[...]` within a path segment and `**`
 * across directories. Dotfiles never match (temp files are dot-named). Results are absolute,
 * deduplicated across patterns and sorted numerically aware, so step_9 comes before step_10.
 *
 * Symbolic links to directories are followed only where the pattern spells the name out; a
 * wildcard segment never descends through one. A `latest -> step_N` link would otherwise list
 * step_N's files twice (once outside any step directory, so unmarked), and a `loop -> .` link
 * would multiply every match or, with two of them, never end. A file reached by two paths (a
 * linked record file, or two patterns naming it through a link) is listed once, under the path
 * that sorts first.
 *
 * A follower expands its globs at every poll, so what a listed file costs matters: a listed entry
 * that is not a link is never stat'ed or resolved. Its type comes with the listing, and its real
 * path is its directory's plus its name, since a wildcard descends only real directories: only
 * the directory a pattern starts from or names literally is resolved (a `latest -> step_N` link
 * can be retargeted), once per expansion. A linked entry is stat'ed and resolved every time, as
 * its target can change. Each directory is still listed at every poll: caching a listing until
 * the directory's mtime changes would miss an entry added within the mtime's granularity (a
 * coarse clock tick) of the listing, such as a step's second env, for good.
 */
export async function expandGlobs(patterns: readonly string[], cwd: string): Promise<string[]> {
  return (await expandGlobFiles(patterns, cwd)).map((f) => f.path);
}

/** expandGlobs with each file's real path: the identity a follower remembers a loaded file by. */
export async function expandGlobFiles(patterns: readonly string[], cwd: string): Promise<{ path: string; real: string }[]> {
  for (const pattern of patterns) {
    const problem = globProblem(pattern);
    if (problem !== null) throw invalidRequest(`record glob ${JSON.stringify(pattern)}: ${problem}`);
  }
  // Each listed path with its real path, or null when only realpath can tell (a link).
  const found = new Map<string, string | null>();
  for (const pattern of patterns) {
    // Only the pattern is a pattern: the directory a relative one resolves against is a path, and
    // a `[`, `?` or `*` in its name (`exp[1]/`) must not make it match another directory (`exp1/`).
    const normal = path.normalize(pattern);
    let base = path.isAbsolute(normal) ? path.parse(normal).root : path.resolve(cwd);
    const segments = normal.slice(path.isAbsolute(normal) ? base.length : 0).split(path.sep).filter((s) => s !== "" && s !== ".");
    while (segments[0] === "..") {
      base = path.dirname(base);
      segments.shift();
    }
    await walk(base, segments, null, found);
  }
  const seen = new Set<string>();
  const out: { path: string; real: string }[] = [];
  for (const file of naturalSort(found.keys())) {
    const real = found.get(file) ?? (await realpathOr(file, file));
    if (seen.has(real)) continue;
    seen.add(real);
    out.push({ path: file, real });
  }
  return out;
}

const MAGIC = /[*?[]/;

/**
 * `real` is `base`'s real path when known: below a wildcard it is the parent's plus the name (a
 * wildcard descends only real directories); after a literal segment, which may name a link, it is
 * null until a listing needs it.
 */
async function walk(base: string, segments: readonly string[], real: string | null, out: Map<string, string | null>): Promise<void> {
  const [segment, ...rest] = segments;
  if (segment === undefined) return;
  if (segment === "**") {
    // `**` at the end means every file below; otherwise it matches zero or more directories.
    const next = rest.length === 0 ? ["*"] : rest;
    await walk(base, next, real, out);
    const entries = (await listDir(base)).filter((entry) => !entry.name.startsWith(".") && isDir(entry));
    if (entries.length > 0) real ??= await realpathOr(base, base);
    for (const entry of entries) await walk(path.join(base, entry.name), segments, path.join(real!, entry.name), out);
    return;
  }
  if (!MAGIC.test(segment)) {
    const target = path.join(base, segment);
    if (rest.length > 0) return walk(target, rest, null, out);
    if (real !== null) {
      // Below a wildcard (`base` a real directory): a file named literally that is no link is, like
      // a listed one, its directory's real path plus its name. One lstat, where a stat and a
      // resolution per step directory and poll made `step_*/<file>` cost twice a listing.
      const entry = await lstatOrAbsent(target);
      if (entry === undefined || entry.isDirectory()) return;
      if (!entry.isSymbolicLink()) out.set(target, path.join(real, segment));
      else if (await namesFile(target)) out.set(target, null);
      return;
    }
    if (await namesFile(target)) out.set(target, null);
    return;
  }
  const regex = segmentRegex(segment);
  const entries = (await listDir(base)).filter((entry) => !entry.name.startsWith(".") && regex.test(entry.name));
  if (entries.length > 0) real ??= await realpathOr(base, base);
  for (const entry of entries) {
    const target = path.join(base, entry.name);
    if (rest.length > 0) {
      if (isDir(entry)) await walk(target, rest, path.join(real!, entry.name), out);
    } else if (!entry.isSymbolicLink()) {
      // Its type is the listing's (never a link's), so only a directory is no file.
      if (!entry.isDirectory()) out.set(target, path.join(real!, entry.name));
    } else if (await namesFile(target)) {
      out.set(target, null);
    }
  }
}

/** `target`'s own type (a link's, never its target's), or undefined when it is not there. */
async function lstatOrAbsent(target: string): Promise<Stats | undefined> {
  return fs.lstat(target).catch((error: unknown) => {
    if (absent(error)) return undefined;
    throw error;
  });
}

/** The real path of `target`, or `fallback` when it is gone (its listing or open will say so). */
async function realpathOr(target: string, fallback: string): Promise<string> {
  return fs.realpath(target).catch((error: unknown) => {
    if (absent(error)) return fallback;
    throw error;
  });
}

/** Why `pattern` cannot be expanded (a `[...]` class that is no valid set, e.g. `[z-a]`), or null. */
export function globProblem(pattern: string): string | null {
  for (const segment of pattern.split("/").flatMap((part) => part.split(path.sep))) {
    if (segment === "**" || !MAGIC.test(segment)) continue;
    try {
      segmentRegex(segment);
    } catch (error) {
      return `segment ${JSON.stringify(segment)} is not a valid pattern (${error instanceof Error ? error.message : String(error)})`;
    }
  }
  return null;
}

function segmentRegex(segment: string): RegExp {
  let source = "";
  for (let i = 0; i < segment.length; i++) {
    const ch = segment[i]!;
    if (ch === "*") source += "[^/]*";
    else if (ch === "?") source += "[^/]";
    else if (ch === "[") {
      const close = segment.indexOf("]", i + 1);
      if (close === -1) source += "\\[";
      else {
        const body = segment.slice(i + 1, close).replace(/^!/, "^").replace(/\\/g, "\\\\");
        source += `[${body}]`;
        i = close;
      }
    } else source += ch.replace(/[.+^${}()|\\\]]/g, "\\$&");
  }
  return new RegExp(`^${source}$`);
}

/**
 * Only a path that is not there matches nothing (yet). Any other refusal (EMFILE, EIO, EACCES) is
 * thrown: read as "nothing here", it would let a follower consume later steps before this one.
 */
function absent(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException).code;
  return code === "ENOENT" || code === "ENOTDIR" || code === "ELOOP";
}

/** A listed entry: its name and type, as a listing gives them (a link's own type, never its target's). */
type Listed = Pick<Dirent, "name" | "isDirectory" | "isSymbolicLink">;

async function listDir(dir: string): Promise<Listed[]> {
  try {
    return await fs.readdir(dir, { withFileTypes: true });
  } catch (error) {
    if (!absent(error)) throw error;
    // Where the filesystem's listing gives no entry types (DT_UNKNOWN: XFS without ftype, some FUSE
    // and network filesystems), Node lstat's each entry itself and fails the whole listing when one
    // is gone by then (a temp file renamed into place): `dir` is there, only that entry is not.
    const failed = (error as NodeJS.ErrnoException).path;
    if (failed === undefined || path.resolve(failed) === path.resolve(dir)) return [];
    return listEachTyped(dir);
  }
}

/** `dir`'s entries typed one by one, an entry gone before its lstat left out (as if listed after it went). */
async function listEachTyped(dir: string): Promise<Listed[]> {
  let names: string[];
  try {
    names = await fs.readdir(dir);
  } catch (error) {
    if (absent(error)) return [];
    throw error;
  }
  const listed: Listed[] = [];
  for (const name of names) {
    const stats = await fs.lstat(path.join(dir, name)).catch((error: unknown) => {
      if (absent(error)) return undefined;
      throw error;
    });
    if (stats) listed.push({ name, isDirectory: () => stats.isDirectory(), isSymbolicLink: () => stats.isSymbolicLink() });
  }
  return listed;
}

/** A directory a wildcard may descend into: a real one, never a symbolic link to one (see expandGlobs). */
function isDir(entry: Listed): boolean {
  return entry.isDirectory();
}

/**
 * A path the pattern names as a file: anything but a directory. A FIFO or a device named like a
 * record file is listed too, so its reader refuses it (invalid_checkpoint_state, at once, never
 * waited on) instead of the load going on without a word.
 */
async function namesFile(target: string): Promise<boolean> {
  return fs.stat(target).then(
    (s) => !s.isDirectory(),
    (error: unknown) => {
      if (absent(error)) return false;
      throw error;
    },
  );
}

/** Compares digit runs as numbers and everything else as text. */
export function naturalCompare(a: string, b: string): number {
  return compareRuns(runsOf(a), runsOf(b), a, b);
}

/**
 * Sorts as naturalCompare does, splitting each name once instead of at each of its ~log n
 * comparisons: a follower sorts every file it lists at every poll, on the event loop.
 */
export function naturalSort(names: Iterable<string>): string[] {
  return [...names]
    .map((name) => ({ name, runs: runsOf(name) }))
    .sort((x, y) => compareRuns(x.runs, y.runs, x.name, y.name))
    .map((x) => x.name);
}

/** Text and digit runs alternately (digit runs at odd positions), leading zeros stripped. */
function runsOf(name: string): string[] {
  return name.split(/(\d+)/).map((run, i) => (i % 2 === 1 ? run.replace(/^0+(?=\d)/, "") : run));
}

function compareRuns(pa: readonly string[], pb: readonly string[], a: string, b: string): number {
  for (let i = 0; i < Math.min(pa.length, pb.length); i++) {
    const x = pa[i]!;
    const y = pb[i]!;
    if (x === y) continue;
    // A digit run compares by value without overflow: length, then digits (zeros are stripped).
    if (i % 2 === 1 && x.length !== y.length) return x.length - y.length;
    return x < y ? -1 : 1;
  }
  if (pa.length !== pb.length) return pa.length - pb.length;
  return a < b ? -1 : a > b ? 1 : 0;
}
