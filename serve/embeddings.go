package serve

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
)

// maxEmbedInputs is OpenAI's own limit of inputs per embeddings request.
const maxEmbedInputs = 2048

// embeddings is POST /v1/embeddings with the server's embedder (the one its
// memory store uses), as OpenAI, Ollama and vLLM serve it: input a string
// or a list of strings, encoding_format float or base64 (the official Node
// client's default), vectors unit length. Token-id inputs and dimensions
// (the embedder's size is fixed) are refused.
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) *apiError {
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat string          `json:"encoding_format"`
		Dimensions     *int            `json:"dimensions"`
		User           string          `json:"user"`
	}
	if aerr := decodeJSON(r, &req, true); aerr != nil {
		return aerr
	}
	if req.Model != s.cfg.ModelName {
		return unknownModel(req.Model, s.cfg.ModelName)
	}
	var texts []string
	var one string
	switch {
	case json.Unmarshal(req.Input, &one) == nil:
		texts = []string{one}
	case json.Unmarshal(req.Input, &texts) == nil:
	default:
		return errInvalid("input", "invalid_input", "input must be a string or a list of strings (token ids are not supported)")
	}
	if len(texts) == 0 || len(texts) > maxEmbedInputs {
		return errInvalid("input", "invalid_input", fmt.Sprintf("input must hold 1 to %d strings, not %d", maxEmbedInputs, len(texts)))
	}
	for i, t := range texts {
		if t == "" {
			return errInvalid("input", "invalid_input", fmt.Sprintf("input[%d] is empty", i))
		}
	}
	switch req.EncodingFormat {
	case "", "float", "base64":
	default:
		return errInvalid("encoding_format", "invalid_value", `encoding_format must be "float" or "base64"`)
	}
	if req.Dimensions != nil && *req.Dimensions != s.enc.Dim() {
		return errInvalid("dimensions", "unsupported", fmt.Sprintf("this embedder's vectors have %d dimensions", s.enc.Dim()))
	}
	vs, err := s.enc.Embed(r.Context(), texts)
	if err != nil {
		return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "embedding_failed", Message: "the embedder failed", cause: err}
	}
	data := make([]map[string]any, len(vs))
	tokens := 0
	for i, v := range vs {
		var emb any = v
		if req.EncodingFormat == "base64" {
			raw := make([]byte, 4*len(v))
			for j, x := range v {
				binary.LittleEndian.PutUint32(raw[4*j:], math.Float32bits(x))
			}
			emb = base64.StdEncoding.EncodeToString(raw)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": emb}
		tokens += s.be.Count(texts[i])
	}
	writeJSON(w, 200, map[string]any{"object": "list", "data": data, "model": s.cfg.ModelName,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}})
	return nil
}
