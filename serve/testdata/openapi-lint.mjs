// Lints an OpenAPI document with Redocly's OpenAPI engine (the library
// `redocly lint` runs), under its recommended-strict rules: the document's
// structure against OpenAPI 3.1 (schema objects included), every $ref
// resolved, path parameters declared, operation ids unique, and every
// example valid against its schema. Prints each problem and exits 1 if
// there is any.
//
// node openapi-lint.mjs <@redocly/openapi-core directory> <document.json>
import path from "node:path";
import { pathToFileURL } from "node:url";

const [pkg, doc] = process.argv.slice(2);
const core = await import(pathToFileURL(path.join(pkg, "lib", "index.js")).href);
const config = await core.createConfig({
  extends: ["recommended-strict"],
  rules: {
    // The shared MCP path item serves /mcp and /mcp/tools: an operation id
    // there would name two operations.
    "operation-operationId": "off",
    // The repository states no license for the API to name.
    "info-license": "off",
    // Health, readiness, metrics and the document have no client errors
    // of their own; openapi_test.go checks a 4xx of every operation that
    // can fail.
    "operation-4xx-response": "off",
  },
});
const problems = await core.lint({ ref: path.resolve(doc), config });
for (const p of problems) {
  const where = (p.location || []).map((l) => l.pointer).join(", ");
  console.log(`${p.severity} ${p.ruleId}: ${p.message} (${where})`);
}
console.log(`${problems.length} problems`);
process.exit(problems.length ? 1 : 0);
