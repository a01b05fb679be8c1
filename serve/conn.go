package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// limitListener caps the connections open at once, overall and per client
// address, so that clients that connect and then send nothing (or trickle)
// cannot take every file descriptor: a connection over a cap is answered
// with a JSON 503 and closed at once. Its connections also turn the plain
// text errors net/http writes itself into the API's JSON errors.
type limitListener struct {
	net.Listener
	max, perClient int
	mu             sync.Mutex
	open           int
	byClient       map[string]int
	refused        func(reason string)
}

func newLimitListener(ln net.Listener, max, perClient int, refused func(string)) *limitListener {
	return &limitListener{Listener: ln, max: max, perClient: perClient, byClient: map[string]int{}, refused: refused}
}

func clientHost(addr net.Addr) string {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		host := clientHost(c.RemoteAddr())
		l.mu.Lock()
		reason := ""
		switch {
		case l.max > 0 && l.open >= l.max:
			reason = "max_connections"
		case l.perClient > 0 && l.byClient[host] >= l.perClient:
			reason = "max_connections_per_client"
		default:
			l.open++
			l.byClient[host]++
		}
		l.mu.Unlock()
		if reason != "" {
			l.refused(reason)
			go refuse(c, reason)
			continue
		}
		return &jsonErrorConn{Conn: c, release: sync.OnceFunc(func() {
			l.mu.Lock()
			l.open--
			if l.byClient[host]--; l.byClient[host] == 0 {
				delete(l.byClient, host)
			}
			l.mu.Unlock()
		})}, nil
	}
}

// refuse answers a connection over a cap without reading from it; the
// write may not block the accept loop, nor for long.
func refuse(c net.Conn, reason string) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	e := &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: reason,
		Message: fmt.Sprintf("too many open connections (serve.%s); retry later", reason)}
	c.Write(rawResponse(e, "Retry-After: 1\r\n"))
	c.Close()
}

// rawResponse is a whole HTTP/1.1 response carrying e as JSON, for the
// places that write to the connection rather than through a handler.
func rawResponse(e *apiError, extra string) []byte {
	body, _ := json.Marshal(map[string]*apiError{"error": e})
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n%s",
		e.Status, http.StatusText(e.Status), len(body), extra, body)
}

type jsonErrorConn struct {
	net.Conn
	release func()
}

func (c *jsonErrorConn) Close() error {
	c.release()
	return c.Conn.Close()
}

// serverError is exactly what net/http writes by itself, before any handler
// runs, for a request it cannot parse (a bad request line, headers over
// MaxHeaderBytes, an unsupported transfer encoding): a status line, these
// two headers and a plain-text body, in one write. A handler's response
// always has a Date header, so never matches.
var serverError = regexp.MustCompile(`^HTTP/1\.1 (\d{3}) [^\r\n]*\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n(?s:(.*))$`)

func (c *jsonErrorConn) Write(b []byte) (int, error) {
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
