/**
 * The first key named twice in one object of a JSON text, or undefined. JSON.parse keeps the last
 * of them without a word, so `{"episode_ids":[...],"episode_ids":null}` would commit everything;
 * strict schemas refuse unknown keys for the same reason. `text` must be valid JSON (scan it only
 * after JSON.parse accepted it). Keys are compared decoded (`"a"` and `"\u0061"` are one key).
 * Iterative: a body nested thousands of levels deep cannot overflow the stack.
 */
export function duplicateJsonKey(text: string): string | undefined {
  // One entry per open object (its keys so far) or array (null).
  const open: (Set<string> | null)[] = [];
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x7b) open.push(new Set());
    else if (c === 0x5b) open.push(null);
    else if (c === 0x7d || c === 0x5d) open.pop();
    else if (c === 0x22) {
      let end = i + 1;
      let escaped = false;
      for (let ch = text.charCodeAt(end); ch !== 0x22; ch = text.charCodeAt(end)) {
        if (ch === 0x5c) escaped = true;
        end += ch === 0x5c ? 2 : 1;
      }
      const keys = open[open.length - 1];
      // In an object, a string followed by a colon is a key (a value is followed by `,` or `}`).
      let next = end + 1;
      while (isJsonWhitespace(text.charCodeAt(next))) next++;
      if (keys && text.charCodeAt(next) === 0x3a) {
        const key = escaped ? (JSON.parse(text.slice(i, end + 1)) as string) : text.slice(i + 1, end);
        if (keys.has(key)) return key;
        keys.add(key);
      }
      i = end;
    }
  }
  return undefined;
}

function isJsonWhitespace(c: number): boolean {
  return c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
}
