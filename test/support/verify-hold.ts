/** Holds (`on`) or releases the reference calculator's `/verify` (`POST /admin/verify/hold|release`, a JSON body). */
export async function verifyHold(resourcesUrl: string, on: boolean): Promise<void> {
  const response = await fetch(`${resourcesUrl.replace(/\/+$/, "")}/admin/verify/${on ? "hold" : "release"}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: "{}",
  });
  if (!response.ok) throw new Error(`/admin/verify/${on ? "hold" : "release"}: HTTP ${response.status}`);
}
