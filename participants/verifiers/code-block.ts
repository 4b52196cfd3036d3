/**
 * The code of an answer to a code verifier: its first fenced block tagged as JavaScript, or the
 * answer itself when it has no fenced block. Shared by the code and competitive-programming
 * verifiers, which run JavaScript only.
 */

/** Tags of a block that is JavaScript, read in any case; an untagged block is JavaScript too. */
const JAVASCRIPT_TAGS = new Set(["", "js", "javascript"]);
/** Longest tag named back in an `unsupported_language` reply (the tag is the model's text). */
const MAX_REPORTED_TAG = 32;

/*
 * An opening is a fence, its tag (no whitespace or backtick), then whitespace holding a newline:
 * the code starts after that run's last newline and ends at the next fence. Not one pattern over
 * the whole answer: /```(?:javascript|js)?\s*\n([\s\S]*?)```/ backtracked over a whitespace run after
 * an unclosed fence, scanning the rest of the answer once per newline (a second per 100,000
 * characters, in this process's only thread). Here each fence is matched where it stands (sticky),
 * and its tag and whitespace runs are each read once.
 */
const OPENING = /```([^\s`]*)(\s*)/y;

/**
 * `{code}` to run, or `{language}` (the first block's tag, lower case) when every fenced block is in
 * another language (```python, ```ts: TypeScript's types do not run as JavaScript). A block in
 * another language is skipped whole, its closing fence too, so it is never read as an opening.
 * An unclosed fence ends the search: the answer is the code, as when there is no fence.
 */
export function submittedCode(answer: string): { code: string } | { language: string } {
  let other: string | undefined;
  for (let at = answer.indexOf("```"); at !== -1; ) {
    OPENING.lastIndex = at;
    const [opening, tag, space] = OPENING.exec(answer)! as unknown as [string, string, string];
    const newline = space.lastIndexOf("\n");
    if (newline === -1) {
      at = answer.indexOf("```", at + 1);
      continue;
    }
    const start = at + opening.length - space.length + newline + 1;
    const end = answer.indexOf("```", start);
    if (end === -1) return { code: answer };
    const language = tag.toLowerCase();
    if (JAVASCRIPT_TAGS.has(language)) return { code: answer.slice(start, end) };
    other ??= language.slice(0, MAX_REPORTED_TAG);
    at = answer.indexOf("```", end + 3);
  }
  return other === undefined ? { code: answer } : { language: other };
}

/** The JavaScript code of an answer (see submittedCode); the answer itself when it has none. */
export function extractCode(answer: string): string {
  const submitted = submittedCode(answer);
  return "code" in submitted ? submitted.code : answer;
}
