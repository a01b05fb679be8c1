// Package browsertest drives a real Chromium (Debian's chromium package)
// from Go tests through chromedp: one fresh headless browser per test, with
// every console message, exception and Content-Security-Policy violation
// of its pages collected, and screenshots written where
// $AGEMEM_SCREENSHOTS names. Where no browser is installed a test skips
// with the reason, unless $AGEMEM_REQUIRE_BROWSER is set (CI sets it and
// installs chromium), when it fails.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Tab is a browser tab of a test.
type Tab struct {
	Ctx context.Context
	t   testing.TB

	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
}

// execPath is the browser: $AGEMEM_CHROMIUM, else the first of Debian's
// and the usual names on $PATH.
func execPath() string {
	if p := os.Getenv("AGEMEM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Start opens a tab in a fresh headless browser, closed when the test ends.
func Start(t testing.TB) *Tab {
	t.Helper()
	bin := execPath()
	if bin == "" {
		if os.Getenv("AGEMEM_REQUIRE_BROWSER") != "" {
			t.Fatal("no Chromium found and AGEMEM_REQUIRE_BROWSER is set (.ci/run installs Debian's chromium; $AGEMEM_CHROMIUM names another)")
		}
		t.Skip("no Chromium found (Debian: apt-get install chromium); set AGEMEM_REQUIRE_BROWSER=1 to fail instead")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox, // CI runs as root, where Chromium's sandbox cannot start
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	tab := &Tab{Ctx: ctx, t: t}
	// Start the browser now, so that a failure to start is named as such.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("start %s: %v", bin, err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			tab.mu.Lock()
			tab.msgs = append(tab.msgs, m)
			tab.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	return tab
}

// Do runs actions, failing the test on an error (30 s at most).
func (b *Tab) Do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// Get runs one action that returns a value.
func Get[T any](b *Tab, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("browser: %v", err)
	}
	return v
}

// Text is the text of the first element sel (CSS) selects.
func (b *Tab) Text(sel string) string {
	b.t.Helper()
	return Get(b, chromedp.Text(chromedp.CSS(sel)))
}

// Location is the tab's URL.
func (b *Tab) Location() string {
	b.t.Helper()
	return Get(b, chromedp.Location())
}

// Problems are the errors the pages reported so far: exceptions, console
// errors and the browser's own error entries (a Content-Security-Policy
// violation, a failed load).
func (b *Tab) Problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.msgs {
		if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
			out = append(out, m.URL+": "+m.Text)
		}
	}
	return out
}

// Messages are every console message so far, as text.
func (b *Tab) Messages() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, m := range b.msgs {
		out = append(out, string(m.Type)+" "+m.Source+": "+m.Text)
	}
	return out
}

// Screenshot writes the whole page as $AGEMEM_SCREENSHOTS/name.png when
// that is set.
func (b *Tab) Screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("AGEMEM_SCREENSHOTS")
	if dir == "" {
		return
	}
	png := Get(b, chromedp.FullScreenshot(100))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(dir, strings.TrimSuffix(name, ".png")+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s", path)
}

// Settle waits for the messages of what the tab just did to arrive (they
// come on their own goroutine).
func (b *Tab) Settle() { time.Sleep(300 * time.Millisecond) }

// Follow runs actions that load a new page (a link clicked, a form sent)
// and waits until the new page has loaded: a wait for an element alone
// could find it on the page being left.
func (b *Tab) Follow(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	Get(b, chromedp.Evaluate[bool](`window.__leaving = true`, chromedp.EvalAsValue))
	b.Do(actions...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// An evaluation may fail while the old page goes (its context
		// destroyed): that is a try, not an error.
		ctx, cancel := context.WithTimeout(b.Ctx, 5*time.Second)
		loaded, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__leaving === undefined && document.readyState === "complete"`, chromedp.EvalAsValue))
		cancel()
		if err == nil && loaded {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("browser: no new page loaded within 30 s (at %s; last error %v)", b.Location(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
