/**
 * The reply of a fake policy to a chat completion request body, as a policy would answer: the same
 * conversation gets the same reply. A user turn gets a calculator tool call, a tool result the answer.
 */
export function calculatorPolicyMessage(body: string): object {
  const messages = (JSON.parse(body) as { messages: { role: string }[] }).messages;
  return messages.at(-1)!.role === "user"
    ? { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "calculator", arguments: '{"expression":"6*7"}' } }] }
    : { role: "assistant", content: "42" };
}
