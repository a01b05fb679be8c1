package serve

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// limitListener caps the connections open at once, overall and per
// client, so that clients that connect and then send nothing (or trickle)
// cannot take every file descriptor. A client is the connection's peer, or
// behind a trusted proxy the client the proxy names (proxy.go): a PROXY
// header's client is capped by its connections, an HTTP proxy's clients
// by their requests in flight (clientLimit). A connection over a cap is
// answered (refuse) and closed. Its connections also turn the plain-text
// errors net/http writes itself into the API's JSON errors.
type limitListener struct {
	net.Listener
	max, perClient int
	trusted        proxies
	health         http.Handler // answers health and readiness on a refused connection
	refused        func(reason string)
	refusing       chan struct{} // refusals in progress from the accept loop
	mu             sync.Mutex
	open           int
	byClient       map[netip.Addr]int
}

// refuseTimeout bounds each step of a refusal: reading the request it
// answers, writing the answer, draining what the client still sends.
const refuseTimeout = time.Second

// maxRefusing refusals run at once; a connection beyond them (a flood) is
// closed unanswered.
const maxRefusing = 256

func newLimitListener(ln net.Listener, max, perClient int, trusted proxies, health http.Handler, refused func(string)) *limitListener {
	return &limitListener{Listener: ln, max: max, perClient: perClient, trusted: trusted, health: health, refused: refused,
		refusing: make(chan struct{}, maxRefusing), byClient: map[netip.Addr]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := addrOf(c.RemoteAddr())
		// A trusted proxy's connections carry many clients: they are
		// capped only overall, their clients each by their own share.
		viaProxy := l.trusted.trusts(peer)
		l.mu.Lock()
		reason := ""
		switch {
		case l.max > 0 && l.open >= l.max:
			reason = "max_connections"
		case !viaProxy && !l.takeLocked(peer):
			reason = "max_connections_per_client"
		default:
			l.open++
		}
		l.mu.Unlock()
		if reason != "" {
			l.refused(reason)
			select {
			case l.refusing <- struct{}{}:
				go func() {
					defer func() { <-l.refusing }()
					br := bufio.NewReader(c)
					if viaProxy {
						c.SetReadDeadline(time.Now().Add(refuseTimeout))
						readProxyHeader(br) // what follows is the request
					}
					l.refuse(c, br, reason)
				}()
			default:
				c.Close()
			}
			continue
		}
		return &clientConn{Conn: c, l: l, client: netip.AddrPortFrom(peer, 0), viaProxy: viaProxy, counted: !viaProxy}, nil
	}
}

// take counts a connection (or a request through an HTTP proxy) of
// client; false at serve.max_connections_per_client.
func (l *limitListener) take(client netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.takeLocked(client)
}

func (l *limitListener) takeLocked(client netip.Addr) bool {
	if l.perClient > 0 && l.byClient[client] >= l.perClient {
		return false
	}
	l.byClient[client]++
	return true
}

func (l *limitListener) release(client netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byClient[client]--; l.byClient[client] <= 0 {
		delete(l.byClient, client)
	}
}

// isHealthCheck is a request for health or readiness, which no
// per-client cap holds back: a load balancer's checks come from its one
// address, and a cap that refused them would take the server out of
// rotation for everyone.
func isHealthCheck(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz")
}

// refuse answers a connection over a cap: it reads the request (for at
// most refuseTimeout), answers a health or readiness check as the server
// does and anything else with the JSON 503, then half-closes and drains
// what the client still sends before closing. Closing with unread
// request bytes would send a TCP reset, and a reset makes the client
// drop the 503 it had not yet read.
func (l *limitListener) refuse(c net.Conn, br *bufio.Reader, reason string) {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(refuseTimeout))
	var out []byte
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(br, 64<<10)))
	if err == nil && isHealthCheck(req) && l.health != nil {
		out = recorded(l.health, req)
	} else {
		e := &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: reason,
			Message: fmt.Sprintf("too many open connections (serve.%s); retry later", reason)}
		out = rawResponse(e, "Retry-After: 1\r\n")
	}
	c.SetWriteDeadline(time.Now().Add(refuseTimeout))
	c.Write(out)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(refuseTimeout))
	io.Copy(io.Discard, io.LimitReader(br, 1<<20))
}

// recorded is h's response to req as HTTP/1.1 bytes, closing.
func recorded(h http.Handler, req *http.Request) []byte {
	rec := &recorder{header: http.Header{}}
	h.ServeHTTP(rec, req)
	resp := &http.Response{StatusCode: cmp.Or(rec.code, 200), ProtoMajor: 1, ProtoMinor: 1, Header: rec.header,
		Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Close: true, Request: req}
	var b bytes.Buffer
	resp.Write(&b)
	return b.Bytes()
}

type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *recorder) Write(b []byte) (int, error) { r.WriteHeader(200); return r.body.Write(b) }

// rawResponse is a whole HTTP/1.1 response carrying e as JSON, for the
// places that write to the connection rather than through a handler.
func rawResponse(e *apiError, extra string) []byte {
	body, _ := json.Marshal(map[string]*apiError{"error": e})
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s",
		e.Status, http.StatusText(e.Status), len(body), extra, body)
}

// clientConn is an accepted connection: who its client is, and its place
// under the caps, given back when it closes.
type clientConn struct {
	net.Conn
	l      *limitListener
	client netip.AddrPort // the peer, or the client a PROXY header named
	// viaProxy: from a trusted proxy, whose first bytes may be a PROXY
	// header; named: one was, and named client.
	viaProxy, named bool
	counted         bool // holds one of client's per-client slots
	header          sync.Once
	br              *bufio.Reader // reads after a trusted proxy's header
	err             error
	closed          sync.Once
	timedOut        atomic.Bool // a read met its deadline
}

var errRefused = errors.New("connection refused over serve.max_connections_per_client")

func (c *clientConn) Read(p []byte) (n int, err error) {
	defer func() {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			c.timedOut.Store(true)
		}
	}()
	if !c.viaProxy {
		return c.Conn.Read(p)
	}
	c.header.Do(c.readProxyHeader)
	if c.err != nil {
		return 0, c.err
	}
	return c.br.Read(p)
}

// readProxyHeader reads a PROXY header if the proxy sent one, and takes
// a slot of the client it names. It runs in the connection's own
// goroutine, at net/http's first read (under serve.read_header_timeout).
func (c *clientConn) readProxyHeader() {
	c.br = bufio.NewReader(c.Conn)
	ap, err := readProxyHeader(c.br)
	var ne net.Error
	switch {
	case errors.Is(err, errNoProxyHeader):
		return // HTTP from the proxy: X-Forwarded-For names each request's client
	case errors.Is(err, io.EOF), errors.As(err, &ne):
		c.err = err
		return
	case err != nil:
		c.Conn.Write(rawResponse(errInvalid("", "invalid_proxy_header", err.Error()), ""))
		c.err = err
		return
	case !ap.IsValid():
		return // the proxy's own connection (LOCAL, UNKNOWN): its health checks
	}
	c.client, c.named = ap, true
	if !c.l.take(ap.Addr()) {
		c.l.refused("max_connections_per_client")
		c.l.refuse(c.Conn, c.br, "max_connections_per_client")
		c.err = errRefused
		return
	}
	c.counted = true
}

func (c *clientConn) Close() error {
	c.closed.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
		if c.counted {
			c.l.release(c.client.Addr())
		}
	})
	return c.Conn.Close()
}

type connKey struct{}

// withConn puts a request's connection into its context (http.Server's
// ConnContext), for clientLimit.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// clientLimit sets each request's RemoteAddr to its client's address and
// holds an HTTP proxy's clients to serve.max_connections_per_client
// requests in flight each (health and readiness checks excepted; a
// request the proxy names no client for is the proxy's own).
func clientLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(*clientConn)
		if c == nil || !c.viaProxy || c.named {
			if c != nil && c.named {
				r.RemoteAddr = c.client.String()
			}
			next.ServeHTTP(w, r)
			return
		}
		client := forwardedClient(r.Header.Values("X-Forwarded-For"), c.client.Addr(), c.l.trusted)
		if client == c.client.Addr() || isHealthCheck(r) {
			next.ServeHTTP(w, r)
			return
		}
		r.RemoteAddr = netip.AddrPortFrom(client, 0).String()
		if !c.l.take(client) {
			c.l.refused("max_connections_per_client")
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "max_connections_per_client",
				Message: "too many requests in flight from your address (serve.max_connections_per_client); retry later", retryAfter: 1})
			return
		}
		defer c.l.release(client)
		next.ServeHTTP(w, r)
	})
}

// serverError is exactly what net/http writes by itself, before any handler
// runs, for a request it cannot parse (a bad request line, headers over
// MaxHeaderBytes, an unsupported transfer encoding): a status line, these
// two headers and a plain-text body, in one write. A handler's response
// always has a Date header, so never matches.
var serverError = regexp.MustCompile(`^HTTP/1\.1 (\d{3}) [^\r\n]*\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n(?s:(.*))$`)

func (c *clientConn) Write(b []byte) (int, error) {
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 ")) {
		return c.Conn.Write(b)
	}
	m := serverError.FindSubmatch(b)
	if m == nil {
		return c.Conn.Write(b)
	}
	status, _ := strconv.Atoi(string(m[1]))
	msg := strings.TrimSpace(string(m[2]))
	code := map[int]string{http.StatusRequestHeaderFieldsTooLarge: "header_too_large", http.StatusNotImplemented: "unsupported_transfer_encoding"}[status]
	if code == "" {
		code = "bad_request"
	}
	e := &apiError{Status: status, Type: "invalid_request_error", Code: code, Message: "the server could not read the request: " + msg}
	if status == http.StatusBadRequest && c.timedOut.Load() {
		// net/http answers headers cut short by serve.read_header_timeout
		// with a bare 400.
		e.Status, e.Code, e.Message = http.StatusRequestTimeout, "header_timeout", "the request's headers did not arrive within serve.read_header_timeout"
	}
	if _, err := c.Conn.Write(rawResponse(e, "")); err != nil {
		return 0, err
	}
	return len(b), nil
}

// cleanPaths refuses a path that is not in its clean form (dot segments,
// repeated slashes) with a JSON 400, where http.ServeMux would answer a
// redirect with an HTML body: an API client has no use for either form,
// and a redirect turns a mistake into a request it did not mean.
func cleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		clean := path.Clean("/" + p)
		if strings.HasSuffix(p, "/") && clean != "/" {
			clean += "/"
		}
		if p != clean {
			writeError(w, errInvalid("path", "invalid_path", fmt.Sprintf("the path %q is not in its clean form (%q)", p, clean)))
			return
		}
		next.ServeHTTP(w, r)
	})
}
