package console

import (
	"testing"
	"time"
)

// TestFailedLoginsAreThrottled: an address gets login_failures failed
// tries a minute; another address is not held back by it; a minute after
// its first failure it may try again.
func TestFailedLoginsAreThrottled(t *testing.T) {
	f := &failures{max: 3}
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		if !f.allow("10.0.0.1", t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("try %d refused", i+1)
		}
		f.failed("10.0.0.1", t0.Add(time.Duration(i)*time.Second))
	}
	if f.allow("10.0.0.1", t0.Add(10*time.Second)) {
		t.Fatal("a fourth try within the minute is allowed")
	}
	if !f.allow("10.0.0.2", t0.Add(10*time.Second)) {
		t.Fatal("another address is refused")
	}
	if !f.allow("10.0.0.1", t0.Add(61*time.Second)) {
		t.Fatal("a try a minute later is refused")
	}
}

// TestSafeNext: a login sends the visitor on only to a console page.
func TestSafeNext(t *testing.T) {
	for next, want := range map[string]string{
		"/ui/memories?namespace=a": "/ui/memories?namespace=a",
		"/ui":                      "/ui",
		"//evil.example/ui/":       "/ui/",
		"https://evil.example/ui/": "/ui/",
		"/\\evil.example":          "/ui/",
		"/v1/memories":             "/ui/",
		"/uix":                     "/ui/",
		"":                         "/ui/",
	} {
		if got := safeNext(next); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", next, got, want)
		}
	}
}
