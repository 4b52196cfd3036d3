import { promises as fs, type Dirent } from "node:fs";
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
  const found = new Set<string>();
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
    await walk(base, segments, found);
  }
  const seen = new Set<string>();
  const out: { path: string; real: string }[] = [];
  for (const file of [...found].sort(naturalCompare)) {
    const real = await fs.realpath(file).catch((error: unknown) => {
      if (absent(error)) return file; // gone since it was listed: its open will say so
      throw error;
    });
    if (seen.has(real)) continue;
    seen.add(real);
    out.push({ path: file, real });
  }
  return out;
}

const MAGIC = /[*?[]/;

async function walk(base: string, segments: readonly string[], out: Set<string>): Promise<void> {
  const [segment, ...rest] = segments;
  if (segment === undefined) return;
  if (segment === "**") {
    // `**` at the end means every file below; otherwise it matches zero or more directories.
    const next = rest.length === 0 ? ["*"] : rest;
    await walk(base, next, out);
    for (const entry of await listDir(base)) {
      if (!entry.name.startsWith(".") && isDir(entry)) await walk(path.join(base, entry.name), segments, out);
    }
    return;
  }
  if (!MAGIC.test(segment)) {
    const target = path.join(base, segment);
    if (rest.length > 0) return walk(target, rest, out);
    if (await namesFile(target)) out.add(target);
    return;
  }
  const regex = segmentRegex(segment);
  for (const entry of await listDir(base)) {
    if (entry.name.startsWith(".") || !regex.test(entry.name)) continue;
    const target = path.join(base, entry.name);
    if (rest.length > 0) {
      if (isDir(entry)) await walk(target, rest, out);
    } else if (await namesFile(target)) {
      out.add(target);
    }
  }
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

async function listDir(dir: string): Promise<Dirent[]> {
  try {
    return await fs.readdir(dir, { withFileTypes: true });
  } catch (error) {
    if (absent(error)) return [];
    throw error;
  }
}

/** A directory a wildcard may descend into: a real one, never a symbolic link to one (see expandGlobs). */
function isDir(entry: Dirent): boolean {
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
  const pa = a.split(/(\d+)/);
  const pb = b.split(/(\d+)/);
  for (let i = 0; i < Math.min(pa.length, pb.length); i++) {
    const x = pa[i]!;
    const y = pb[i]!;
    if (x === y) continue;
    if (i % 2 === 1) {
      // Digit run: compare by value without overflow (strip zeros, then length, then digits).
      const nx = x.replace(/^0+(?=\d)/, "");
      const ny = y.replace(/^0+(?=\d)/, "");
      if (nx.length !== ny.length) return nx.length - ny.length;
      if (nx !== ny) return nx < ny ? -1 : 1;
      continue;
    }
    return x < y ? -1 : 1;
  }
  if (pa.length !== pb.length) return pa.length - pb.length;
  return a < b ? -1 : a > b ? 1 : 0;
}
