// Renders Jinja templates with @huggingface/jinja, the reference that
// python/tests/test_chat_templates.py compares `dayzero chat-template` against.
// Input (argv[2], a JSON file): [{"template": "...", "context": {...}}, ...]
// Output (stdout, JSON): [{"ok": true, "text": "..."} | {"ok": false, "error": "..."}, ...]
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = cases.map(({ template, context }) => {
  try {
    return { ok: true, text: new Template(template).render(context) };
  } catch (error) {
    return { ok: false, error: String(error && error.message ? error.message : error) };
  }
});
process.stdout.write(JSON.stringify(results));
