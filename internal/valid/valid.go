// Package valid collects what is wrong with a section of options, each
// error naming its key, so that a package can validate the options it owns
// and the config that composes them can name the full key path
// (tools.filter_threshold) without knowing the rules.
package valid

import (
	"errors"
	"fmt"
	"strings"
)

// Error is one key's problem.
type Error struct{ Key, Msg string }

// Errors is every problem of a section; the zero value has none.
type Errors []Error

// Error lists the problems one per line, indented under the first.
func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, x := range e {
		lines[i] = x.Key + ": " + x.Msg
	}
	return strings.Join(lines, "\n  ")
}

// Err is e as an error, nil when there is no problem.
func (e Errors) Err() error {
	if len(e) == 0 {
		return nil
	}
	return e
}

// Add records a problem with key.
func (e *Errors) Add(key, format string, args ...any) {
	*e = append(*e, Error{key, fmt.Sprintf(format, args...)})
}

// Section adds a nested section's problems under prefix (prefix.key); an
// error that is not Errors is recorded under prefix itself.
func (e *Errors) Section(prefix string, err error) {
	if err == nil {
		return
	}
	var sub Errors
	if !errors.As(err, &sub) {
		e.Add(prefix, "%v", err)
		return
	}
	for _, x := range sub {
		*e = append(*e, Error{prefix + "." + x.Key, x.Msg})
	}
}

// OneOf checks v is one of ok.
func (e *Errors) OneOf(key, v string, ok ...string) {
	for _, o := range ok {
		if v == o {
			return
		}
	}
	e.Add(key, "%q is not one of %s", v, strings.Join(ok, ", "))
}

// AtLeast checks v >= min.
func (e *Errors) AtLeast(key string, v, min int) {
	if v < min {
		e.Add(key, "%d is below the minimum %d", v, min)
	}
}

// Positive checks v > 0.
func (e *Errors) Positive(key string, v float64) {
	if v <= 0 {
		e.Add(key, "%g must be positive", v)
	}
}

// NotNegative checks v >= 0.
func (e *Errors) NotNegative(key string, v float64) {
	if v < 0 {
		e.Add(key, "%g must not be negative", v)
	}
}

// Fraction checks v in [0, 1) (dropout rates, shares held out).
func (e *Errors) Fraction(key string, v float64) {
	if v < 0 || v >= 1 {
		e.Add(key, "%g is outside [0, 1)", v)
	}
}

// Ratio checks v in [0, 1].
func (e *Errors) Ratio(key string, v float64) {
	if v < 0 || v > 1 {
		e.Add(key, "%g is outside [0, 1]", v)
	}
}

// Device checks a device name: cpu, cuda, cuda:N, and auto when allowed.
func (e *Errors) Device(key, d string, auto bool) {
	if d == "cpu" || d == "cuda" || (auto && d == "auto") {
		return
	}
	if n, ok := strings.CutPrefix(d, "cuda:"); ok {
		var i int
		if _, err := fmt.Sscanf(n, "%d", &i); err == nil && i >= 0 && fmt.Sprint(i) == n {
			return
		}
	}
	if auto {
		e.Add(key, "%q is not auto, cpu, cuda or cuda:N", d)
	} else {
		e.Add(key, "%q is not cpu, cuda or cuda:N", d)
	}
}
