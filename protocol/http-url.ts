/** Whether `value` is an absolute http:// or https:// URL (`localhost:8000` parses, as scheme `localhost:`, and is not). */
export function isHttpUrl(value: string): boolean {
  return URL.canParse(value) && /^https?:$/.test(new URL(value).protocol);
}
