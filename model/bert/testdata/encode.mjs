// Encodes texts with Hugging Face's tokenizers (the JS port) for the
// WordPiece parity test:
//   NPM_PREFIX=.cache/npm node encode.mjs TOKENIZER_JSON < texts.json
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const require = createRequire(join(process.env.NPM_PREFIX, "node_modules", "x.js"));
const mod = await import(pathToFileURL(require.resolve("@huggingface/tokenizers")).href);
const Tokenizer = mod.Tokenizer ?? mod.default.Tokenizer;
const tj = JSON.parse(readFileSync(process.argv[2], "utf8"));
const texts = JSON.parse(readFileSync(0, "utf8"));
const tok = new Tokenizer(tj, {});
console.log(JSON.stringify(texts.map((t) => tok.encode(t).ids)));
