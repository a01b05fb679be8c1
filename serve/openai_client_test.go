package serve

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agemem/agemem/internal/testkit"
)

// openaiScript drives the server with OpenAI's official Node client:
// a completion, a streamed completion with usage, the model list and an
// error, printed as one JSON object.
const openaiScript = `
const mod = require(process.env.OPENAI_PKG);
const OpenAI = mod.default ?? mod.OpenAI ?? mod;
const client = new OpenAI({ baseURL: process.env.BASE + "/v1", apiKey: process.env.KEY, maxRetries: 0 });
(async () => {
  const out = {};
  const r = await client.chat.completions.create({ model: "agemem", messages: [{ role: "user", content: "Remember: the wifi password is hunter2" }] });
  out.content = r.choices[0].message.content;
  out.usage = r.usage;
  const stream = await client.chat.completions.create({ model: "agemem", stream: true, stream_options: { include_usage: true },
    messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Recall: wifi password" }] });
  out.streamed = ""; out.streamUsage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length) { out.streamed += chunk.choices[0].delta.content ?? ""; out.finish = chunk.choices[0].finish_reason ?? out.finish; }
    if (chunk.usage) out.streamUsage = chunk.usage;
  }
  out.models = (await client.models.list()).data.map((m) => m.id);
  const e = await client.embeddings.create({ model: "agemem", input: ["the wifi password", "hunter2"] });
  out.embeddings = e.data.map((d) => d.embedding);
  try { await client.chat.completions.create({ model: "gpt-4o", messages: [{ role: "user", content: "x" }] }); }
  catch (e) { out.errStatus = e.status; out.errCode = e.code; }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
`

func TestOfficialOpenAIClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	pkg := filepath.Join(testkit.NPM(t), "node_modules", "openai")
	ts := start(t, testConfig(t), newScripted())
	script := filepath.Join(t.TempDir(), "client.cjs")
	os.WriteFile(script, []byte(openaiScript), 0o644)
	cmd := exec.Command(node, script)
	cmd.Env = append(os.Environ(), "OPENAI_PKG="+pkg, "BASE="+ts.URL, "KEY="+aliceKey)
	raw, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("client: %v\n%s", err, stderr)
	}
	var out struct {
		Content, Streamed, Finish, ErrCode string
		Usage, StreamUsage                 map[string]float64
		Models                             []string
		ErrStatus                          int
		Embeddings                         [][]float32
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	if out.Content != "Stored." || out.Usage["total_tokens"] == 0 {
		t.Errorf("completion: %+v", out)
	}
	if !strings.Contains(out.Streamed, "hunter2") || out.Finish != "stop" || out.StreamUsage["completion_tokens"] == 0 {
		t.Errorf("stream: %+v", out)
	}
	if len(out.Models) != 1 || out.Models[0] != "agemem" {
		t.Errorf("models: %v", out.Models)
	}
	// The client asks for base64 by default and decodes it: the same
	// vectors the server's embedder gives.
	want, _ := ts.srv.enc.Embed(t.Context(), []string{"the wifi password", "hunter2"})
	if len(out.Embeddings) != 2 {
		t.Errorf("embeddings: %d vectors", len(out.Embeddings))
	}
	for i := range out.Embeddings {
		if fmt.Sprint(out.Embeddings[i]) != fmt.Sprint(want[i]) {
			t.Errorf("embedding %d differs from the embedder's", i)
		}
	}
	if out.ErrStatus != 404 || out.ErrCode != "model_not_found" {
		t.Errorf("error: %d %q", out.ErrStatus, out.ErrCode)
	}
}
