// Package console is agemem's web console: server-rendered pages (Go's
// html/template, assets embedded, no CDN) for a namespace's memories, the
// agent's recent conversations, the server's health and training runs
// (curves drawn server-side as SVG, evaluation tables, a rollout browser).
// serve mounts it at /ui behind its API keys; agemem-train console serves
// the run pages alone. Every page reads without JavaScript; a small script
// of our own refreshes live figures.
//
// Safety is built in rather than added per page: every response carries a
// strict Content-Security-Policy (no inline script or style, no other
// origin), every value is escaped by html/template (a memory reading
// "<script>" shows as text), every state-changing form carries a CSRF
// token bound to the login and is checked for a cross-origin request, the
// login cookie is HttpOnly and SameSite=Strict, and an API key travels
// only in a POST body, never a URL.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/agemem/agemem/memtools/ltm"
)

// Prefix is where the console lives on a server.
const Prefix = "/ui"

// Principal is who a console visitor acts as: an API key's namespace, and
// whether the key is an admin's (any namespace, and the training runs).
type Principal struct {
	Namespace string
	Admin     bool
	KeyID     string // a short hash of the key, for the audit trail
}

// Memories are the memory operations the console offers. serve implements
// them with the same functions its memory API runs, so a change made on a
// page is the API's operation and lands in the same audit trail. Errors
// are shown to the visitor as they are: an implementation keeps internals
// out of them, and may say its HTTP status with an HTTPStatus method.
type Memories interface {
	// Page is the namespace's memories newest first, offset and limit
	// into that order, and how many it holds.
	Page(ctx context.Context, ns string, offset, limit int) ([]ltm.Entry, int, error)
	Search(ctx context.Context, ns, query string, topK int) ([]ltm.Scored, error)
	Get(ctx context.Context, ns, id string) (ltm.Entry, error)
	Add(ctx context.Context, by Principal, ns string, w Write) (ltm.Entry, error)
	Update(ctx context.Context, by Principal, ns, id string, w Write) (ltm.Entry, error)
	Delete(ctx context.Context, by Principal, ns, id string) error
	// Export writes the namespace as the memory API's JSONL export.
	Export(ctx context.Context, ns string, w io.Writer) error
	// Namespaces lists every namespace (for admins).
	Namespaces(ctx context.Context) ([]string, error)
}

// Write is a memory as a form submits it. A nil Metadata on an update
// keeps the memory's metadata.
type Write struct {
	Content    string
	MemoryType string
	Metadata   map[string]any
}

// Conversations are the agent's recent turns, by namespace.
type Conversations interface {
	// Conversations lists the namespace's conversations, the most
	// recently active first.
	Conversations(ctx context.Context, ns string) ([]Conversation, error)
	// Turns are one conversation's turns, oldest first.
	Turns(ctx context.Context, ns, id string) ([]Turn, error)
}

// Figure is one live figure of the health page.
type Figure struct {
	Name, Value, Help string
}

// Options assemble a console.
type Options struct {
	Config Config
	// Login maps an API key to who it is (false: not a key). Nil: there
	// are no keys and every visitor is Open.
	Login func(key string) (Principal, bool)
	Open  Principal
	// The pages' sources; a nil one hides its pages.
	Memories      Memories
	Conversations Conversations
	Health        func() []Figure
	Logger        *slog.Logger
	// Title names the console in the header (default "agemem").
	Title string
}

// Console is the console's http.Handler, for paths under Prefix.
type Console struct {
	o        Options
	mux      *http.ServeMux
	logins   *logins
	failures *failures
	tmpl     map[string]*template.Template
	runs     *runStore
	static   http.Handler
	cop      *http.CrossOriginProtection
	log      *slog.Logger
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New checks the options and builds the pages.
func New(o Options) (*Console, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	if o.Title == "" {
		o.Title = "agemem"
	}
	c := &Console{o: o, logins: newLogins(o.Config.SessionTTL, o.Config.MaxLogins), log: o.Logger,
		failures: &failures{max: o.Config.LoginFailures}, cop: http.NewCrossOriginProtection()}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if o.Config.Runs != "" {
		c.runs = newRunStore(o.Config.Runs)
	}
	var err error
	if c.tmpl, err = parseTemplates(); err != nil {
		return nil, err
	}
	sub, _ := fs.Sub(staticFS, "static")
	c.static = http.StripPrefix(Prefix+"/static/", http.FileServerFS(sub))
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusForbidden, "a cross-origin request may not change anything here")
	}))
	m := http.NewServeMux()
	m.Handle("GET "+Prefix+"/static/", c.static)
	m.HandleFunc("GET "+Prefix+"/login", c.loginPage)
	m.HandleFunc("POST "+Prefix+"/login", c.login)
	m.Handle("POST "+Prefix+"/logout", c.authed(c.logout))
	m.Handle("GET "+Prefix+"/{$}", c.authed(c.home))
	if o.Memories != nil {
		m.Handle("GET "+Prefix+"/memories", c.authed(c.memories))
		m.Handle("POST "+Prefix+"/memories", c.authed(c.addMemory))
		m.Handle("GET "+Prefix+"/memories/export", c.authed(c.exportMemories))
		m.Handle("GET "+Prefix+"/memories/{id}", c.authed(c.memory))
		m.Handle("POST "+Prefix+"/memories/{id}", c.authed(c.updateMemory))
		m.Handle("GET "+Prefix+"/memories/{id}/delete", c.authed(c.confirmDelete))
		m.Handle("POST "+Prefix+"/memories/{id}/delete", c.authed(c.deleteMemory))
	}
	if o.Conversations != nil {
		m.Handle("GET "+Prefix+"/conversations", c.authed(c.conversations))
		m.Handle("GET "+Prefix+"/conversations/{id}", c.authed(c.conversation))
	}
	if o.Health != nil {
		m.Handle("GET "+Prefix+"/health", c.authed(c.health))
	}
	if c.runs != nil {
		m.Handle("GET "+Prefix+"/runs", c.authed(c.adminOnly(c.runList)))
		m.Handle("GET "+Prefix+"/runs/run", c.authed(c.adminOnly(c.runPage)))
		m.Handle("GET "+Prefix+"/runs/compare", c.authed(c.adminOnly(c.compare)))
		m.Handle("GET "+Prefix+"/runs/chart.svg", c.authed(c.adminOnly(c.chart)))
		m.Handle("GET "+Prefix+"/runs/rollouts", c.authed(c.adminOnly(c.rollouts)))
		m.Handle("GET "+Prefix+"/runs/group", c.authed(c.adminOnly(c.group)))
		m.Handle("GET "+Prefix+"/runs/evals", c.authed(c.adminOnly(c.evals)))
	}
	m.HandleFunc(Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "no console page at "+r.URL.Path)
	})
	c.mux = m
	return c, nil
}

// csp allows only the console's own script, styles and images: no inline
// script or style (so nothing a model or user wrote can run even if it
// escaped its escaping), no other origin, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// ServeHTTP serves a console path with the security headers every
// response carries.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	if !strings.HasPrefix(r.URL.Path, Prefix+"/static/") {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

// page is what every template gets.
type page struct {
	Title   string
	App     string
	Nav     string
	Who     Principal
	Open    bool // no login: nothing to log out of
	NS      string
	All     []string // every namespace, for an admin's selector
	CSRF    string
	Notice  string
	Refresh int // seconds; 0: a still page
	// What the console offers, for the navigation.
	HasMemories, HasConversations, HasHealth, HasRuns bool
	Data                                              any
}

func (c *Console) page(r *http.Request, nav, title string, data any) *page {
	s := sessionFrom(r.Context())
	p := &page{Title: title, App: c.o.Title, Nav: nav, Data: data, Open: c.o.Login == nil,
		HasMemories: c.o.Memories != nil, HasConversations: c.o.Conversations != nil, HasHealth: c.o.Health != nil,
		Notice: notices[r.URL.Query().Get("done")]}
	if s != nil {
		p.Who, p.CSRF = s.p, s.csrf
		p.HasRuns = c.runs != nil && (s.p.Admin || c.o.Login == nil)
		p.NS = s.p.Namespace
	}
	return p
}

// notices are the messages a redirect after a change may show (by key, so
// no text travels in a URL).
var notices = map[string]string{"added": "Memory added.", "updated": "Memory updated.", "deleted": "Memory deleted."}

func (c *Console) render(w http.ResponseWriter, status int, name string, p *page) {
	t, ok := c.tmpl[name]
	if !ok {
		panic("console: no template " + name)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	var buf strings.Builder
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		c.log.Error("console: render", "template", name, "err", err)
		http.Error(w, "the page failed to render; the server's log has the details", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(status)
	io.WriteString(w, buf.String())
}

// fail shows an error page with status.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p := c.page(r, "", http.StatusText(status), map[string]any{"Status": status, "Message": msg})
	c.render(w, status, "error", p)
}

// failErr shows err, with the status it names (HTTPStatus), else 500
// with the message kept for the log.
func (c *Console) failErr(w http.ResponseWriter, r *http.Request, err error) {
	var st interface{ HTTPStatus() int }
	if errors.As(err, &st) {
		c.fail(w, r, st.HTTPStatus(), err.Error())
		return
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		c.fail(w, r, http.StatusGatewayTimeout, "the request took too long")
		return
	}
	c.log.Error("console: request failed", "path", r.URL.Path, "err", err)
	c.fail(w, r, http.StatusInternalServerError, "the request failed; the server's log has the details")
}

func (c *Console) home(w http.ResponseWriter, r *http.Request) {
	to := Prefix + "/runs"
	switch {
	case c.o.Memories != nil:
		to = Prefix + "/memories"
	case c.o.Health != nil:
		to = Prefix + "/health"
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// adminOnly keeps a page to admin keys (on a console without logins,
// everyone: the server is open).
func (c *Console) adminOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s := sessionFrom(r.Context()); s == nil || !(s.p.Admin || c.o.Login == nil) {
			c.fail(w, r, http.StatusForbidden, "training runs are shown to admin keys only")
			return
		}
		h(w, r)
	}
}

// templates ------------------------------------------------------------

var funcs = template.FuncMap{
	"clip": clip,
	"when": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
	"json":  compactJSON,
	"pjson": prettyJSON,
	"f3":    func(v float64) string { return fmt.Sprintf("%.3f", v) },
	"add":   func(a, b int) int { return a + b },
	"q":     queryEscape,
	"has":   slices.Contains[[]string],
	// dict passes several values to a shared template.
	"dict": func(kv ...any) (map[string]any, error) {
		if len(kv)%2 != 0 {
			return nil, errors.New("dict: odd arguments")
		}
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			k, ok := kv[i].(string)
			if !ok {
				return nil, errors.New("dict: a key is not a string")
			}
			m[k] = kv[i+1]
		}
		return m, nil
	},
}

func parseTemplates() (map[string]*template.Template, error) {
	// The layout and the shared pieces (_*.html), then each page on a copy.
	base, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/_*.html")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" || strings.HasPrefix(name, "_") {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		out[name] = t
	}
	return out, nil
}

// clip shortens s to n runes for a table cell (the page of the thing shows
// it whole).
func clip(n int, s string) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
