package ollama

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/ollama/ollama/api"

	"github.com/agemem/agemem/model/chat"
)

// Template is the Ollama (Go text/template) form of the Qwen3 chat format
// the policy was trained with: ChatML turns; an assistant turn after the
// last user message keeps its reasoning as a <think> block (Ollama holds it
// in .Thinking), earlier ones lose it; consecutive tool results share one
// user turn as <tool_response> blocks; then the open assistant turn. It is
// what `ollama run` and Ollama's chat API render. The AgeMem runtime itself
// uses raw generation with prompts rendered here, so its prompts do not
// depend on it (Ollama merges consecutive messages of one role, which the
// Qwen template does not).
const Template = `{{- if .Tools }}<|im_start|>system
{{ if and .Messages (eq (index .Messages 0).Role "system") }}{{ (index .Messages 0).Content }}

{{ end }}` + toolsSection + `{{ end }}
{{- $lastUser := -1 }}
{{- range $i, $m := .Messages }}{{ if eq $m.Role "user" }}{{ $lastUser = $i }}{{ end }}{{ end }}
{{- $last := "" }}
{{- range $i, $m := .Messages }}
{{- if eq $m.Role "tool" }}
{{- if ne $last "tool" }}<|im_start|>user{{ end }}
<tool_response>
{{ $m.Content }}
</tool_response>
{{- else if not (and $.Tools (eq $i 0) (eq $m.Role "system")) }}
{{- if eq $last "tool" }}<|im_end|>
{{ end }}<|im_start|>{{ $m.Role }}
{{ if and (eq $m.Role "assistant") (gt $i $lastUser) $m.Thinking }}<think>
{{ $m.Thinking }}
</think>

{{ end }}{{ $m.Content }}` + toolCalls + `<|im_end|>
{{ end }}
{{- $last = $m.Role }}
{{- end }}
{{- if eq $last "tool" }}<|im_end|>
{{ end }}<|im_start|>assistant
`

// toolsSection is the tools section both Qwen templates open the system
// turn with when a request carries tools (Ollama writes each tool's JSON
// compactly).
const toolsSection = `# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{{ json . }}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
`

// toolCalls writes an assistant message's calls as <tool_call> blocks.
const toolCalls = `{{ range $j, $tc := $m.ToolCalls }}{{ if or $j $m.Content }}
{{ end }}<tool_call>
{"name": "{{ $tc.Function.Name }}", "arguments": {{ json $tc.Function.Arguments }}}
</tool_call>{{ end }}`

// Qwen25Template is the Ollama form of Qwen2.5's chat format (which the
// embedded default's policy is trained with): Qwen's default system
// message when the conversation brings none, ChatML turns kept as written
// (no reasoning dropped), consecutive tool results in one user turn as
// <tool_response> blocks, then the open assistant turn.
const Qwen25Template = `{{- if .Tools }}<|im_start|>system
{{ if and .Messages (eq (index .Messages 0).Role "system") }}{{ (index .Messages 0).Content }}{{ else }}You are Qwen, created by Alibaba Cloud. You are a helpful assistant.{{ end }}

` + toolsSection + `{{ else if or (not .Messages) (ne (index .Messages 0).Role "system") }}<|im_start|>system
You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>
{{ end }}
{{- $last := "" }}
{{- range $i, $m := .Messages }}
{{- if eq $m.Role "tool" }}
{{- if ne $last "tool" }}<|im_start|>user{{ end }}
<tool_response>
{{ $m.Content }}
</tool_response>
{{- else if not (and $.Tools (eq $i 0) (eq $m.Role "system")) }}
{{- if eq $last "tool" }}<|im_end|>
{{ end }}<|im_start|>{{ $m.Role }}
{{ $m.Content }}` + toolCalls + `<|im_end|>
{{ end }}
{{- $last = $m.Role }}
{{- end }}
{{- if eq $last "tool" }}<|im_end|>
{{ end }}<|im_start|>assistant
`

// TemplateText is the Ollama template of a chat family.
func TemplateText(t chat.Template) string {
	if t == chat.Qwen25 {
		return Qwen25Template
	}
	return Template
}

// Described is what the server says of a model that a policy needs.
type Described struct {
	// Template is the chat family it renders with: the one whose Ollama
	// template it carries when it was published from here (its template
	// names the family exactly; the policy's tokenizer_config, not its
	// architecture, decided it), otherwise its architecture's (TemplateFor)
	// for models from elsewhere.
	Template chat.Template
	// ContextLength is its <arch>.context_length (0: not given).
	ContextLength int
}

// Describe asks the server about model.
func (c *Client) Describe(ctx context.Context, model string) (Described, error) {
	resp, err := c.API.Show(ctx, &api.ShowRequest{Model: model})
	if err != nil {
		return Described{}, c.wrap(model, 0, err)
	}
	arch, _ := resp.ModelInfo["general.architecture"].(string)
	d := Described{Template: TemplateFor(arch)}
	switch resp.Template {
	case Template:
		d.Template = chat.Qwen3
	case Qwen25Template:
		d.Template = chat.Qwen25
	}
	if n, ok := resp.ModelInfo[arch+".context_length"].(float64); ok {
		d.ContextLength = int(n)
	}
	return d, nil
}

// PublishOptions shape the Ollama model made from a GGUF file.
type PublishOptions struct {
	// Chat is the chat family the policy was trained with (chat.Detect of
	// its directory); its Ollama template is the model's.
	Chat chat.Template
	// System is the model's default system prompt (the AgeMem prompt the
	// policy was trained under), so `ollama run` starts where training did.
	System string
	// Parameters are Modelfile parameters; stop defaults to Stops.
	Parameters map[string]any
	// Progress receives Ollama's status lines.
	Progress func(status string)
}

// Publish uploads the GGUF file at path as a blob and creates model name
// from it with the Qwen template and stop sequences, so that `ollama run
// name` talks to the policy.
func (c *Client) Publish(ctx context.Context, path, name string, o PublishOptions) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if err := c.API.CreateBlob(ctx, digest, f); err != nil {
		return fmt.Errorf("uploading %s: %w", path, c.wrap(name, 0, err))
	}
	params := map[string]any{"stop": Stops}
	for k, v := range o.Parameters {
		params[k] = v
	}
	req := &api.CreateRequest{Model: name, Files: map[string]string{"model.gguf": digest},
		Template: TemplateText(o.Chat), System: o.System, Parameters: params}
	err = c.API.Create(ctx, req, func(p api.ProgressResponse) error {
		if o.Progress != nil && p.Status != "" {
			o.Progress(p.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("creating model %q: %w", name, c.wrap(name, 0, err))
	}
	return nil
}
