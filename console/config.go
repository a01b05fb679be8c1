package console

import (
	"time"

	"github.com/agemem/agemem/internal/valid"
)

// Config is the console (serve.console; agemem-train console reads Runs
// and Refresh from its flags).
type Config struct {
	// Enabled serves the console at /ui.
	Enabled bool `yaml:"enabled"`
	// Runs is a folder of training runs shown at /ui/runs to admin keys
	// (every folder below it holding a metrics.jsonl is a run, every JSON
	// evaluation report an eval table); "" shows none.
	Runs string `yaml:"runs"`
	// SessionTTL is how long a console login lasts; MaxLogins are held at
	// once (at the cap the oldest is logged out).
	SessionTTL time.Duration `yaml:"session_ttl"`
	MaxLogins  int           `yaml:"max_logins"`
	// LoginFailures are the failed logins one client address may make in a
	// minute; beyond them it is told to wait (429), so keys cannot be
	// guessed at speed.
	LoginFailures int `yaml:"login_failures"`
	// PageSize is the memories a page lists.
	PageSize int `yaml:"page_size"`
	// Refresh is how often a live page (health, a run still training)
	// refreshes its figures.
	Refresh time.Duration `yaml:"refresh"`
	// Turns are the recent agent-loop turns kept in memory for the
	// conversation pages, at most TurnsPerNamespace of one namespace (the
	// oldest go first; 0 keeps none).
	Turns             int `yaml:"turns"`
	TurnsPerNamespace int `yaml:"turns_per_namespace"`
	// ListRefresh bounds how stale the memory list may be: the server
	// keeps each namespace's list in memory, updated by its own writes and
	// re-read when the namespace's count changes or this long after the
	// last read (another process may have edited a memory).
	ListRefresh time.Duration `yaml:"list_refresh"`
}

// DefaultConfig is the console on, without training runs.
func DefaultConfig() Config {
	return Config{Enabled: true, SessionTTL: 12 * time.Hour, MaxLogins: 1000, LoginFailures: 10, PageSize: 50, Refresh: 5 * time.Second,
		Turns: 2000, TurnsPerNamespace: 200, ListRefresh: 30 * time.Second}
}

// Validate checks every key.
func (c Config) Validate() error {
	var e valid.Errors
	for _, d := range []struct {
		key string
		d   time.Duration
	}{{"session_ttl", c.SessionTTL}, {"refresh", c.Refresh}, {"list_refresh", c.ListRefresh}} {
		if d.d <= 0 {
			e.Add(d.key, "%s must be positive (a duration such as 30s or 12h)", d.d)
		}
	}
	e.AtLeast("max_logins", c.MaxLogins, 1)
	e.AtLeast("login_failures", c.LoginFailures, 1)
	if c.PageSize < 1 || c.PageSize > 1000 {
		e.Add("page_size", "%d is outside [1, 1000]", c.PageSize)
	}
	e.AtLeast("turns", c.Turns, 0)
	e.AtLeast("turns_per_namespace", c.TurnsPerNamespace, 0)
	return e.Err()
}
