// Drives `dayzero serve` with the official `openai` npm client, for python/tests/test_server.py.
//   node openai_client.mjs BASE_URL API_KEY MODEL [chat]
// Prints one JSON object: the completion (non-streaming and streaming) and, with "chat", the chat
// completion both ways, as the client parsed them. Errors are printed as {"error": ...} with
// exit code 1, so the python test sees what the client rejected.
import OpenAI from "openai";

const [baseURL, apiKey, model, withChat] = process.argv.slice(2);
// The platform's fetch (undici, Node >= 18), as the client's v5 uses by default: v4's bundled
// node-fetch 2.7 reports every streamed response of a keep-alive connection as "Premature close"
// on Debian 12's Node 18 (not on Node 20), while curl, Python and undici read the same bytes whole.
const client = new OpenAI({ baseURL, apiKey, timeout: 30000, maxRetries: 0, fetch: globalThis.fetch });

async function streamed(iterator) {
  const chunks = [];
  for await (const chunk of iterator) chunks.push(chunk);
  return chunks;
}

async function main() {
  const out = {};
  out.completion = await client.completions.create({
    model, prompt: "hello world", max_tokens: 6, temperature: 0,
  });
  const completionChunks = await streamed(await client.completions.create({
    model, prompt: "hello world", max_tokens: 6, temperature: 0, stream: true,
  }));
  out.completion_stream = {
    text: completionChunks.map((c) => c.choices.map((ch) => ch.text).join("")).join(""),
    finish_reason: completionChunks.at(-1)?.choices[0]?.finish_reason ?? null,
    num_chunks: completionChunks.length,
  };
  if (withChat === "chat") {
    const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi!" }];
    out.chat = await client.chat.completions.create({
      model, messages, max_tokens: 6, temperature: 0,
    });
    const chatChunks = await streamed(await client.chat.completions.create({
      model, messages, max_tokens: 6, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    }));
    const withChoices = chatChunks.filter((c) => c.choices.length > 0);
    out.chat_stream = {
      role: withChoices[0]?.choices[0]?.delta?.role ?? null,
      content: withChoices.map((c) => c.choices[0].delta.content ?? "").join(""),
      finish_reason: withChoices.at(-1)?.choices[0]?.finish_reason ?? null,
      usage: chatChunks.at(-1)?.usage ?? null,
      ids: [...new Set(chatChunks.map((c) => c.id))],
    };
  }
  out.models = (await client.models.list()).data;
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.log(JSON.stringify({ error: String(e), status: e?.status ?? null }));
  process.exit(1);
});
