/** Calls the reference policy backend's admin API (`/admin/*`): POST with a body, GET without. */
export async function backendAdmin(baseUrl: string, path: string, body?: unknown): Promise<any> {
  const response = await fetch(`${baseUrl}${path}`, {
    method: body === undefined ? "GET" : "POST",
    ...(body !== undefined && { headers: { "content-type": "application/json" }, body: JSON.stringify(body) }),
  });
  if (!response.ok) throw new Error(`policy backend ${path}: HTTP ${response.status}`);
  return response.json();
}
