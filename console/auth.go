package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"
)

// A login is a random token in an HttpOnly, SameSite=Strict cookie; the
// server keeps only the token's SHA-256 with the principal it stands for
// and the CSRF token of its forms. The API key itself is checked once, at
// login, and never stored or put in a URL.
const (
	cookieName = "agemem_console"
	// loginCookie holds the nonce the login form echoes (double submit):
	// a login cannot be forged from another site.
	loginCookie = "agemem_console_login"
	// maxForm bounds a form's body.
	maxForm = 1 << 20
)

type login struct {
	p       Principal
	csrf    string
	expires time.Time
	created time.Time
}

type logins struct {
	mu  sync.Mutex
	m   map[[32]byte]*login
	ttl time.Duration
	max int
	now func() time.Time
}

func newLogins(ttl time.Duration, max int) *logins {
	return &logins{m: map[[32]byte]*login{}, ttl: ttl, max: max, now: time.Now}
}

func randomToken() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// create starts a login for p and returns its cookie token.
func (l *logins) create(p Principal) (string, *login) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	for k, s := range l.m {
		if now.After(s.expires) {
			delete(l.m, k)
		}
	}
	for len(l.m) >= l.max {
		var oldest [32]byte
		var at time.Time
		for k, s := range l.m {
			if at.IsZero() || s.created.Before(at) {
				oldest, at = k, s.created
			}
		}
		delete(l.m, oldest)
	}
	tok := randomToken()
	s := &login{p: p, csrf: randomToken(), expires: now.Add(l.ttl), created: now}
	l.m[sha256.Sum256([]byte(tok))] = s
	return tok, s
}

func (l *logins) get(tok string) *login {
	if tok == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := sha256.Sum256([]byte(tok))
	s := l.m[k]
	if s != nil && l.now().After(s.expires) {
		delete(l.m, k)
		return nil
	}
	return s
}

func (l *logins) drop(tok string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, sha256.Sum256([]byte(tok)))
}

// failures counts each client address's failed logins over the minute
// since its first.
type failures struct {
	mu  sync.Mutex
	m   map[string]*window
	max int
}

type window struct {
	start time.Time
	n     int
}

// maxAddrs bounds the addresses remembered (older windows go first).
const maxAddrs = 10000

// allow reports whether addr may try to log in at now.
func (f *failures) allow(addr string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.m[addr]
	return w == nil || now.Sub(w.start) > time.Minute || w.n < f.max
}

func (f *failures) failed(addr string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]*window{}
	}
	if len(f.m) >= maxAddrs {
		for k, w := range f.m {
			if now.Sub(w.start) > time.Minute {
				delete(f.m, k)
			}
		}
		if len(f.m) >= maxAddrs {
			clear(f.m)
		}
	}
	w := f.m[addr]
	if w == nil || now.Sub(w.start) > time.Minute {
		w = &window{start: now}
		f.m[addr] = w
	}
	w.n++
}

// clientAddr is the request's client address without its port.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

type sessionKey struct{}

func sessionFrom(ctx context.Context) *login {
	s, _ := ctx.Value(sessionKey{}).(*login)
	return s
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value, path string, maxAge int) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: path, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

func cookie(r *http.Request, name string) string {
	ck, err := r.Cookie(name)
	if err != nil {
		return ""
	}
	return ck.Value
}

// authed runs h for a logged-in visitor (an open console logs every
// visitor in as Open on their first page, so its forms carry CSRF tokens
// too). A request that changes something must also pass the cross-origin
// check and carry its login's CSRF token.
func (c *Console) authed(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := c.logins.get(cookie(r, cookieName))
		safe := r.Method == http.MethodGet || r.Method == http.MethodHead
		if s == nil {
			switch {
			case c.o.Login == nil && safe:
				var tok string
				tok, s = c.logins.create(c.o.Open)
				c.setCookie(w, r, cookieName, tok, Prefix, int(c.o.Config.SessionTTL.Seconds()))
			case safe:
				http.Redirect(w, r, Prefix+"/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			default:
				c.fail(w, r, http.StatusForbidden, "not logged in (or the login expired): log in again and resend the form")
				return
			}
		}
		r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, s))
		if !safe {
			if err := c.cop.Check(r); err != nil {
				c.fail(w, r, http.StatusForbidden, "a cross-origin request may not change anything here")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if err := r.ParseForm(); err != nil {
				c.fail(w, r, http.StatusBadRequest, "the form could not be read: "+err.Error())
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(s.csrf)) != 1 {
				c.fail(w, r, http.StatusForbidden, "the form's CSRF token is missing or stale: reload the page and send it again")
				return
			}
		}
		h(w, r)
	})
}

type loginData struct {
	Next, Nonce, Error string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.o.Login == nil {
		http.Redirect(w, r, Prefix+"/", http.StatusSeeOther)
		return
	}
	if r.URL.Query().Has("key") {
		c.fail(w, r, http.StatusBadRequest, "an API key never goes in a URL (it would stay in logs and the browser's history): type it into the login form")
		return
	}
	c.showLogin(w, r, http.StatusOK, safeNext(r.URL.Query().Get("next")), "")
}

func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, status int, next, msg string) {
	nonce := randomToken()
	c.setCookie(w, r, loginCookie, nonce, Prefix+"/login", 600)
	c.render(w, status, "login", c.page(r, "login", "Log in", loginData{Next: next, Nonce: nonce, Error: msg}))
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.o.Login == nil {
		http.Redirect(w, r, Prefix+"/", http.StatusSeeOther)
		return
	}
	if err := c.cop.Check(r); err != nil {
		c.fail(w, r, http.StatusForbidden, "a login may not come from another site")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "the form could not be read: "+err.Error())
		return
	}
	if r.URL.Query().Has("key") {
		c.fail(w, r, http.StatusBadRequest, "an API key never goes in a URL: type it into the login form")
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	nonce := cookie(r, loginCookie)
	if nonce == "" || subtle.ConstantTimeCompare([]byte(nonce), []byte(r.PostForm.Get("nonce"))) != 1 {
		c.showLogin(w, r, http.StatusForbidden, next, "The login form expired; log in again.")
		return
	}
	addr := clientAddr(r)
	if !c.failures.allow(addr, time.Now()) {
		w.Header().Set("Retry-After", "60")
		c.showLogin(w, r, http.StatusTooManyRequests, next, "Too many failed logins from this address: wait a minute (serve.console.login_failures).")
		return
	}
	p, ok := c.o.Login(strings.TrimSpace(r.PostForm.Get("key")))
	if !ok {
		c.failures.failed(addr, time.Now())
		c.log.Info("console: login refused", "remote", r.RemoteAddr)
		c.showLogin(w, r, http.StatusUnauthorized, next, "That is not a valid API key.")
		return
	}
	tok, _ := c.logins.create(p)
	c.setCookie(w, r, loginCookie, "", Prefix+"/login", -1)
	c.setCookie(w, r, cookieName, tok, Prefix, int(c.o.Config.SessionTTL.Seconds()))
	c.log.Info("console: login", "key", p.KeyID, "namespace", p.Namespace, "admin", p.Admin, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	c.logins.drop(cookie(r, cookieName))
	c.setCookie(w, r, cookieName, "", Prefix, -1)
	to := Prefix + "/login"
	if c.o.Login == nil {
		to = Prefix + "/"
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// safeNext is where a login may send the visitor: a console path on this
// server, never another site ("//evil", "/\evil").
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") ||
		!(u.Path == Prefix || strings.HasPrefix(u.Path, Prefix+"/")) {
		return Prefix + "/"
	}
	return next
}

// namespaceRE is a namespace's form (as serve's keys).
var namespaceRE = regexp.MustCompile(`^[A-Za-z0-9._@:-]{1,128}$`)

// namespace is the namespace a page acts on: the login's own, or for an
// admin the one the page names (?namespace=, or the form's field).
func (c *Console) namespace(r *http.Request) (string, int, string) {
	s := sessionFrom(r.Context())
	ns := r.FormValue("namespace")
	if ns == "" || ns == s.p.Namespace {
		return s.p.Namespace, 0, ""
	}
	if !s.p.Admin {
		return "", http.StatusForbidden, "this key may not see namespace " + ns
	}
	if !namespaceRE.MatchString(ns) {
		return "", http.StatusBadRequest, "a namespace is 1-128 letters, digits and . _ @ : -"
	}
	return ns, 0, ""
}

func queryEscape(s string) string { return url.QueryEscape(s) }
