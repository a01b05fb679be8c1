// Package openai is a client of any server that speaks OpenAI's
// chat-completions and embeddings protocol (vLLM, llama.cpp's server, LM
// Studio, SGLang, Ollama's /v1, a hosted API, and our own serve), and the
// roles it can play: policy, judge, summariser and embedder.
package openai

import (
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/agemem/agemem/internal/valid"
)

// Config is the server behind every role set to "openai" (config section
// "openai").
type Config struct {
	// BaseURL is the API root, e.g. http://127.0.0.1:8000/v1 (the paths
	// /chat/completions and /embeddings are appended).
	BaseURL string `yaml:"base_url"`
	// APIKeyEnv names the environment variable that holds the API key
	// (empty: no key is sent). The key itself never goes in a config.
	APIKeyEnv string `yaml:"api_key_env"`
	// Model is the chat model (policy, judge, summariser unless a role
	// names its own).
	Model string `yaml:"model"`
	// Format is how a policy model is driven: raw (the AgeMem text format
	// in message content: for policies trained here) or tools (the memory
	// tools as native function calls, mapped back to the AgeMem format).
	Format string `yaml:"format"`
	// Timeout bounds one attempt of a request, streaming included.
	Timeout time.Duration `yaml:"timeout"`
	// MaxRetries is how often a request is retried after 429, a 5xx or a
	// connection error, waiting as Retry-After says or backing off
	// exponentially from RetryBackoff.
	MaxRetries   int           `yaml:"max_retries"`
	RetryBackoff time.Duration `yaml:"retry_backoff"`
}

// DefaultConfig: raw format, 2-minute attempts, 4 retries from 500 ms.
func DefaultConfig() Config {
	return Config{Format: "raw", Timeout: 2 * time.Minute, MaxRetries: 4, RetryBackoff: 500 * time.Millisecond}
}

// Validate checks every key; a base_url is needed only where a role uses
// the server (Connect says so).
func (c Config) Validate() error {
	var e valid.Errors
	e.OneOf("format", c.Format, "raw", "tools")
	if c.BaseURL != "" {
		if u, err := url.Parse(c.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			e.Add("base_url", "%q is not an http(s) URL such as http://127.0.0.1:8000/v1", c.BaseURL)
		}
	}
	if c.Timeout <= 0 {
		e.Add("timeout", "%v must be positive", c.Timeout)
	}
	e.AtLeast("max_retries", c.MaxRetries, 0)
	if c.RetryBackoff < 0 {
		e.Add("retry_backoff", "%v must not be negative", c.RetryBackoff)
	}
	return e.Err()
}

// Connect is a client of the configured server, with the key read from
// $APIKeyEnv.
func (c Config) Connect() (*Client, error) {
	if c.BaseURL == "" {
		return nil, fmt.Errorf("openai.base_url is not set: name the server's API root, e.g. http://127.0.0.1:8000/v1")
	}
	key := ""
	if c.APIKeyEnv != "" {
		key = os.Getenv(c.APIKeyEnv)
		if key == "" {
			return nil, fmt.Errorf("openai.api_key_env names $%s, which is empty: export the server's API key there", c.APIKeyEnv)
		}
	}
	return New(c, key, nil)
}
